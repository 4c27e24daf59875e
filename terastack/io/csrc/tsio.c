/*
 * terastack native I/O core.
 *
 * The Python side hands over whole vectors of requests (op, fd, offset, length,
 * buffer address) in one call; this file owns the threads or the io_uring ring
 * that submit and complete them. Nothing here touches Python objects, so every
 * entry point can be called with the GIL released (ctypes does so).
 *
 * [Note: control plane]
 * Callers only *issue*: ts_submit copies the requests into a queue and returns a
 * batch id at once. The control plane (a pool of pthreads doing pread/pwrite,
 * or one thread driving an io_uring ring) moves the bytes, retries short
 * transfers and EINTR/EAGAIN, writes one result per request (bytes moved, or
 * -errno) into the caller's results array and, when the last request of a batch
 * is done, puts the batch on the done list that ts_reap drains. A read that
 * stops early at end of file completes with the bytes it got; the caller
 * decides whether that is an error.
 *
 * [Note: io_uring doorbell]
 * The ring thread always keeps one read of an eventfd in flight. ts_submit
 * writes that eventfd, so the ring thread sleeps in io_uring_enter waiting for
 * "one completion" and is woken either by finished I/O or by new work, with no
 * polling and no second wait primitive.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define TS_VERSION 1

#define TS_OP_READ 0
#define TS_OP_WRITE 1

#define TS_KIND_THREADS 1
#define TS_KIND_URING 2

/* One syscall moves at most this much; the rest goes through the short-transfer path.
 * Tests lower it (ts_set_syscall_limit) to drive every transfer through that path. */
#define TS_MAX_SYSCALL_BYTES (1LL << 30)
static int64_t g_syscall_limit = TS_MAX_SYSCALL_BYTES;
/* EINTR/EAGAIN/zero-progress writes are retried this often before giving up. */
#define TS_MAX_RETRIES 1000
/* A worker takes at most this many queued requests at a time (amortizes the lock). */
#define TS_MAX_TAKE 64

/* Laid out exactly like the numpy dtype REQUEST_DTYPE in terastack/io/requests.py. */
typedef struct {
    int32_t op;
    int32_t fd;
    int64_t offset;
    int64_t length;
    uint64_t addr;
} ts_request;

typedef struct ts_batch {
    uint64_t id;
    int64_t *results;
    atomic_int_fast64_t remaining;
    struct ts_batch *next;
} ts_batch;

typedef struct {
    ts_request req;
    int64_t done;
    ts_batch *batch;
    uint32_t index;
    uint32_t retries;
} ts_work;

typedef struct {
    ts_work *items;
    size_t head, count, cap;
} ts_queue;

typedef struct {
    int fd;
    unsigned sq_entries, cq_entries;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_cqe *cqes;
    struct io_uring_sqe *sqes;
    void *sq_map, *cq_map;
    size_t sq_map_len, cq_map_len, sqes_len;
    unsigned local_tail;
} ts_ring;

typedef struct ts_engine {
    int kind;
    int nthreads;
    unsigned depth;

    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    ts_queue queue;
    int stopping;

    pthread_mutex_t dlock;
    pthread_cond_t dcond;
    ts_batch *done_head, *done_tail;
    uint64_t next_batch_id;

    pthread_t *threads;
    int started_threads;

    /* io_uring: one control thread per ring, all draining the same queue */
    struct ts_uring_ctx *rings;
    pthread_mutex_t init_lock;
    pthread_cond_t init_cond;
    int init_done, init_error;
} ts_engine;

typedef struct ts_uring_ctx {
    ts_engine *engine;
    ts_ring ring;
    int efd;               /* doorbell, see [Note: io_uring doorbell] */
    uint64_t doorbell_buf;
    unsigned depth;        /* requests this ring keeps in flight */
} ts_uring_ctx;

/* ------------------------------------------------------------------ queue */

static int queue_reserve(ts_queue *q, size_t extra) {
    if (q->count + extra <= q->cap) return 0;
    size_t cap = q->cap ? q->cap : 1024;
    while (cap < q->count + extra) cap *= 2;
    ts_work *items = malloc(cap * sizeof(ts_work));
    if (!items) return -ENOMEM;
    for (size_t i = 0; i < q->count; i++) items[i] = q->items[(q->head + i) % q->cap];
    free(q->items);
    q->items = items;
    q->head = 0;
    q->cap = cap;
    return 0;
}

static void queue_push_back(ts_queue *q, const ts_work *w) {
    q->items[(q->head + q->count) % q->cap] = *w;
    q->count++;
}

static void queue_push_front(ts_queue *q, const ts_work *w) {
    q->head = (q->head + q->cap - 1) % q->cap;
    q->items[q->head] = *w;
    q->count++;
}

static ts_work queue_pop(ts_queue *q) {
    ts_work w = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    return w;
}

/* ------------------------------------------------------------- completion */

static void complete_batch(ts_engine *e, ts_batch *b) {
    pthread_mutex_lock(&e->dlock);
    b->next = NULL;
    if (e->done_tail) e->done_tail->next = b; else e->done_head = b;
    e->done_tail = b;
    pthread_cond_broadcast(&e->dcond);
    pthread_mutex_unlock(&e->dlock);
}

static void finish(ts_engine *e, ts_work *w, int64_t result) {
    w->batch->results[w->index] = result;
    if (atomic_fetch_sub(&w->batch->remaining, 1) == 1) complete_batch(e, w->batch);
}

/* Requeue at the front so a retried transfer is not starved by newer work. */
static int requeue(ts_engine *e, ts_work *w) {
    pthread_mutex_lock(&e->qlock);
    int err = queue_reserve(&e->queue, 1);
    if (!err) {
        queue_push_front(&e->queue, w);
        pthread_cond_signal(&e->qcond);
    }
    pthread_mutex_unlock(&e->qlock);
    return err;
}

/* ------------------------------------------------------- threads backend */

static int64_t do_io(ts_work *w) {
    ts_request *r = &w->req;
    while (w->done < r->length) {
        int64_t want = r->length - w->done;
        if (want > g_syscall_limit) want = g_syscall_limit;
        char *p = (char *)(uintptr_t)(r->addr + (uint64_t)w->done);
        ssize_t n = r->op == TS_OP_READ ? pread(r->fd, p, (size_t)want, r->offset + w->done)
                                        : pwrite(r->fd, p, (size_t)want, r->offset + w->done);
        if (n < 0) {
            if ((errno == EINTR || errno == EAGAIN) && w->retries++ < TS_MAX_RETRIES) continue;
            return -errno;
        }
        if (n == 0) {
            if (r->op == TS_OP_READ) break; /* end of file: short result */
            if (w->retries++ < TS_MAX_RETRIES) continue;
            return -EIO;
        }
        w->done += n;
    }
    return w->done;
}

static void *worker_main(void *arg) {
    ts_engine *e = arg;
    ts_work local[TS_MAX_TAKE];
    for (;;) {
        pthread_mutex_lock(&e->qlock);
        while (e->queue.count == 0 && !e->stopping) pthread_cond_wait(&e->qcond, &e->qlock);
        if (e->queue.count == 0) { /* stopping and drained */
            pthread_mutex_unlock(&e->qlock);
            return NULL;
        }
        size_t take = e->queue.count / (size_t)e->nthreads;
        if (take < 1) take = 1;
        if (take > TS_MAX_TAKE) take = TS_MAX_TAKE;
        for (size_t i = 0; i < take; i++) local[i] = queue_pop(&e->queue);
        if (e->queue.count) pthread_cond_signal(&e->qcond);
        pthread_mutex_unlock(&e->qlock);
        for (size_t i = 0; i < take; i++) finish(e, &local[i], do_io(&local[i]));
    }
}

/* -------------------------------------------------------- io_uring backend */

static int sys_uring_setup(unsigned entries, struct io_uring_params *p) {
    long r = syscall(__NR_io_uring_setup, entries, p);
    return r < 0 ? -errno : (int)r;
}

static int sys_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
    long r = syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, 0);
    return r < 0 ? -errno : (int)r;
}

static void ring_unmap(ts_ring *r) {
    if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_len);
    if (r->cq_map && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map) munmap(r->cq_map, r->cq_map_len);
    if (r->sq_map && r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_map_len);
    if (r->fd >= 0) close(r->fd);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
}

static int ring_init(ts_ring *r, unsigned entries) {
    /* Newest flags first: they cut task-work interrupts; older kernels reject them. */
    const unsigned flag_sets[] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
                                  IORING_SETUP_COOP_TASKRUN, 0};
    struct io_uring_params p;
    int fd = -EINVAL;
    for (size_t i = 0; i < sizeof(flag_sets) / sizeof(flag_sets[0]); i++) {
        memset(&p, 0, sizeof(p));
        p.flags = flag_sets[i];
        fd = sys_uring_setup(entries, &p);
        if (fd >= 0 || fd != -EINVAL) break;
    }
    if (fd < 0) return fd;
    memset(r, 0, sizeof(*r));
    r->fd = fd;
    r->sq_entries = p.sq_entries;
    r->cq_entries = p.cq_entries;
    r->sq_map_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_map_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (r->cq_map_len > r->sq_map_len) r->sq_map_len = r->cq_map_len;
        r->cq_map_len = r->sq_map_len;
    }
    r->sq_map = mmap(NULL, r->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                     IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED) goto fail;
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        r->cq_map = r->sq_map;
    } else {
        r->cq_map = mmap(NULL, r->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                         IORING_OFF_CQ_RING);
        if (r->cq_map == MAP_FAILED) goto fail;
    }
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                   IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) goto fail;
    char *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    r->local_tail = *r->sq_tail;
    return 0;
fail: {
    int err = -errno;
    ring_unmap(r);
    return err;
}
}

static unsigned ring_sq_pending(ts_ring *r) {
    return r->local_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
}

static struct io_uring_sqe *ring_next_sqe(ts_ring *r) {
    if (ring_sq_pending(r) >= r->sq_entries) return NULL;
    unsigned idx = r->local_tail & *r->sq_mask;
    struct io_uring_sqe *sqe = &r->sqes[idx];
    memset(sqe, 0, sizeof(*sqe));
    r->sq_array[idx] = idx;
    r->local_tail++;
    return sqe;
}

static void ring_publish(ts_ring *r) {
    __atomic_store_n(r->sq_tail, r->local_tail, __ATOMIC_RELEASE);
}

static void prep_rw(struct io_uring_sqe *sqe, const ts_work *w, uint64_t user_data) {
    int64_t want = w->req.length - w->done;
    if (want > g_syscall_limit) want = g_syscall_limit;
    sqe->opcode = w->req.op == TS_OP_READ ? IORING_OP_READ : IORING_OP_WRITE;
    sqe->fd = w->req.fd;
    sqe->off = (uint64_t)(w->req.offset + w->done);
    sqe->addr = w->req.addr + (uint64_t)w->done;
    sqe->len = (unsigned)want;
    sqe->user_data = user_data;
}

#define DOORBELL_TAG 0

static void prep_doorbell(ts_uring_ctx *ctx, struct io_uring_sqe *sqe) {
    sqe->opcode = IORING_OP_READ;
    sqe->fd = ctx->efd;
    sqe->off = (uint64_t)-1; /* current position: eventfds are not seekable */
    sqe->addr = (uint64_t)(uintptr_t)&ctx->doorbell_buf;
    sqe->len = sizeof(ctx->doorbell_buf);
    sqe->user_data = DOORBELL_TAG;
}

static void uring_report_init(ts_engine *e, int err) {
    pthread_mutex_lock(&e->init_lock);
    if (err && !e->init_error) e->init_error = err;
    e->init_done++;
    pthread_cond_broadcast(&e->init_cond);
    pthread_mutex_unlock(&e->init_lock);
}

/*
 * [Note: io_uring submission batching]
 * Submitting many SQEs in one io_uring_enter lets the kernel plug the block
 * requests and start the first one only after the last is prepared; for
 * device-bound random reads that latency costs throughput at a fixed queue
 * depth (measured here: ~80k vs ~93k 4 KiB IOPS at depth 64). Submitting at
 * most two per call avoids the plug. Requests that complete during their own
 * io_uring_enter (page-cache hits) have no device latency to hide, and there
 * one call per request would cap the rate, so while every request of the last
 * call completed inline the per-call cap doubles (up to 256), and it drops
 * back to two as soon as one did not.
 */
#define URING_MIN_BATCH 2
#define URING_MAX_BATCH 256

typedef struct {
    ts_work work;
    uint64_t submitted_in; /* sequence number of the io_uring_enter that submitted it */
} uring_slot;

static void fail_all(ts_engine *e, unsigned depth, uring_slot *slots, uint32_t *free_slots, unsigned *nfree,
                     unsigned *inflight, int err) {
    char *busy = calloc(depth, 1);
    if (busy) {
        for (unsigned s = 0; s < depth; s++) busy[s] = 1;
        for (unsigned k = 0; k < *nfree; k++) busy[free_slots[k]] = 0;
        for (unsigned s = 0; s < depth; s++) if (busy[s]) finish(e, &slots[s].work, err);
        free(busy);
    }
    *nfree = depth;
    for (unsigned i = 0; i < depth; i++) free_slots[i] = i;
    *inflight = 0;
    pthread_mutex_lock(&e->qlock);
    while (e->queue.count) {
        ts_work w = queue_pop(&e->queue);
        finish(e, &w, err);
    }
    pthread_mutex_unlock(&e->qlock);
}

static void uring_complete(ts_engine *e, ts_work *w, int res) {
    if (res < 0) {
        if ((res == -EINTR || res == -EAGAIN) && w->retries++ < TS_MAX_RETRIES) {
            if (requeue(e, w)) finish(e, w, -ENOMEM);
        } else {
            finish(e, w, res);
        }
    } else if (res == 0) {
        if (w->req.op == TS_OP_READ) finish(e, w, w->done); /* end of file */
        else if (w->retries++ < TS_MAX_RETRIES) { if (requeue(e, w)) finish(e, w, -ENOMEM); }
        else finish(e, w, -EIO);
    } else {
        w->done += res;
        if (w->done < w->req.length) { if (requeue(e, w)) finish(e, w, -ENOMEM); }
        else finish(e, w, w->done);
    }
}

static void *uring_main(void *arg) {
    ts_uring_ctx *ctx = arg;
    ts_engine *e = ctx->engine;
    ts_ring *r = &ctx->ring;
    const unsigned depth = ctx->depth;
    /* The ring is created on this thread: SINGLE_ISSUER binds it to its creator. */
    int err = ring_init(r, depth * 2);
    uring_slot *slots = NULL;
    uint32_t *free_slots = NULL;
    if (!err) {
        slots = calloc(depth, sizeof(uring_slot));
        free_slots = malloc(depth * sizeof(uint32_t));
        if (!slots || !free_slots) err = -ENOMEM;
    }
    if (err) {
        free(slots);
        free(free_slots);
        if (r->fd >= 0 && r->sq_map) ring_unmap(r);
        uring_report_init(e, err);
        return NULL;
    }
    unsigned nfree = depth, inflight = 0;
    for (unsigned i = 0; i < depth; i++) free_slots[i] = depth - 1 - i;
    int doorbell_armed = 0;
    unsigned batch_cap = URING_MIN_BATCH;
    uint64_t enter_seq = 0;
    uring_report_init(e, 0);

    for (;;) {
        if (!doorbell_armed) {
            struct io_uring_sqe *sqe = ring_next_sqe(r);
            if (sqe) { prep_doorbell(ctx, sqe); doorbell_armed = 1; }
        }
        /* Move queued work into the ring, at most batch_cap per io_uring_enter. */
        unsigned added = 0;
        pthread_mutex_lock(&e->qlock);
        while (nfree && e->queue.count && added < batch_cap && ring_sq_pending(r) < r->sq_entries) {
            uint32_t s = free_slots[--nfree];
            slots[s].work = queue_pop(&e->queue);
            slots[s].submitted_in = enter_seq + 1;
            prep_rw(ring_next_sqe(r), &slots[s].work, (uint64_t)s + 1);
            inflight++;
            added++;
        }
        int more_to_submit = nfree && e->queue.count;
        int stop_now = e->stopping && e->queue.count == 0 && inflight == 0;
        pthread_mutex_unlock(&e->qlock);
        if (stop_now) break;
        ring_publish(r);

        /* Wait for a completion (or the doorbell) only when nothing more can be submitted now. */
        enter_seq++;
        int ret = sys_uring_enter(r->fd, ring_sq_pending(r), more_to_submit ? 0 : 1, IORING_ENTER_GETEVENTS);
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
            fail_all(e, depth, slots, free_slots, &nfree, &inflight, ret); /* the ring itself is broken */
            continue;
        }

        unsigned inline_done = 0;
        unsigned head = *r->cq_head;
        unsigned tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
        while (head != tail) {
            struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
            uint64_t tag = cqe->user_data;
            int res = cqe->res;
            head++;
            if (tag == DOORBELL_TAG) {
                doorbell_armed = 0; /* re-armed at the top of the loop */
                continue;
            }
            uint32_t s = (uint32_t)(tag - 1);
            if (slots[s].submitted_in == enter_seq) inline_done++;
            free_slots[nfree++] = s;
            inflight--;
            uring_complete(e, &slots[s].work, res);
        }
        __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
        if (added) {
            if (inline_done >= added) batch_cap = batch_cap * 2 > URING_MAX_BATCH ? URING_MAX_BATCH : batch_cap * 2;
            else batch_cap = URING_MIN_BATCH;
        }
    }
    free(slots);
    free(free_slots);
    ring_unmap(r);
    return NULL;
}

/* --------------------------------------------------------------- public */

int ts_version(void) { return TS_VERSION; }

/* Caps the bytes of one read/write syscall (<= 0 restores the default); returns the previous cap. */
int64_t ts_set_syscall_limit(int64_t limit) {
    int64_t old = g_syscall_limit;
    g_syscall_limit = limit > 0 && limit < TS_MAX_SYSCALL_BYTES ? limit : TS_MAX_SYSCALL_BYTES;
    return old;
}

/* 0 when an io_uring ring can be created here, else -errno (ENOSYS, EPERM in many containers). */
int ts_uring_probe(void) {
    ts_ring r;
    memset(&r, 0, sizeof(r));
    r.fd = -1;
    int err = ring_init(&r, 8);
    if (!err) ring_unmap(&r);
    return err;
}

static void ignore_sigxfsz(void) {
    /* The default action of SIGXFSZ kills the process; ignored, write() returns EFBIG instead. */
    struct sigaction old;
    if (sigaction(SIGXFSZ, NULL, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGXFSZ, SIG_IGN);
}

static void engine_free(ts_engine *e) {
    if (e->rings) {
        for (int i = 0; i < e->nthreads; i++) if (e->rings[i].efd >= 0) close(e->rings[i].efd);
        free(e->rings);
    }
    free(e->threads);
    free(e->queue.items);
    pthread_mutex_destroy(&e->qlock);
    pthread_cond_destroy(&e->qcond);
    pthread_mutex_destroy(&e->dlock);
    pthread_cond_destroy(&e->dcond);
    pthread_mutex_destroy(&e->init_lock);
    pthread_cond_destroy(&e->init_cond);
    free(e);
}

/* Wake up to `count` rings (a batch of one request needs one ring; rotate so all share the work). */
static void ring_doorbells(ts_engine *e, int64_t count) {
    static atomic_uint next_ring;
    if (!e->rings) return;
    int n = count < e->nthreads ? (int)count : e->nthreads;
    unsigned first = atomic_fetch_add(&next_ring, 1);
    for (int i = 0; i < n; i++) {
        uint64_t one = 1;
        ssize_t ignored = write(e->rings[(first + (unsigned)i) % (unsigned)e->nthreads].efd, &one, sizeof(one));
        (void)ignored;
    }
}

static void stop_threads(ts_engine *e) {
    pthread_mutex_lock(&e->qlock);
    e->stopping = 1;
    pthread_cond_broadcast(&e->qcond);
    pthread_mutex_unlock(&e->qlock);
    ring_doorbells(e, e->nthreads);
    for (int i = 0; i < e->started_threads; i++) pthread_join(e->threads[i], NULL);
    e->started_threads = 0;
}

/*
 * kind TS_KIND_THREADS: nthreads workers doing blocking pread/pwrite (depth unused).
 * kind TS_KIND_URING: nthreads rings, each with its own control thread, sharing
 * `depth` requests in flight between them. On failure returns NULL, *err = -errno.
 */
ts_engine *ts_engine_create(int kind, int nthreads, int depth, int *err) {
    *err = 0;
    if ((kind != TS_KIND_THREADS && kind != TS_KIND_URING) || nthreads < 1 || depth < nthreads) {
        *err = -EINVAL;
        return NULL;
    }
    ts_engine *e = calloc(1, sizeof(ts_engine));
    if (!e) { *err = -ENOMEM; return NULL; }
    e->kind = kind;
    e->nthreads = nthreads;
    e->depth = (unsigned)depth;
    e->next_batch_id = 1;
    pthread_mutex_init(&e->qlock, NULL);
    pthread_cond_init(&e->qcond, NULL);
    pthread_mutex_init(&e->dlock, NULL);
    pthread_cond_init(&e->dcond, NULL);
    pthread_mutex_init(&e->init_lock, NULL);
    pthread_cond_init(&e->init_cond, NULL);
    e->threads = calloc((size_t)e->nthreads, sizeof(pthread_t));
    if (!e->threads) { *err = -ENOMEM; engine_free(e); return NULL; }
    if (kind == TS_KIND_URING) {
        e->rings = calloc((size_t)nthreads, sizeof(ts_uring_ctx));
        if (!e->rings) { *err = -ENOMEM; engine_free(e); return NULL; }
        for (int i = 0; i < nthreads; i++) e->rings[i].efd = -1;
        for (int i = 0; i < nthreads; i++) {
            ts_uring_ctx *c = &e->rings[i];
            c->engine = e;
            c->depth = (unsigned)(depth / nthreads + (i < depth % nthreads));
            c->efd = eventfd(0, EFD_CLOEXEC);
            if (c->efd < 0) { *err = -errno; engine_free(e); return NULL; }
        }
    }
    ignore_sigxfsz();

    /* Control-plane threads take no signals: Python handles them on its main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int i = 0; i < e->nthreads; i++) {
        int rc = kind == TS_KIND_URING ? pthread_create(&e->threads[i], NULL, uring_main, &e->rings[i])
                                       : pthread_create(&e->threads[i], NULL, worker_main, e);
        if (rc) { *err = -rc; break; }
        e->started_threads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (*err) { stop_threads(e); engine_free(e); return NULL; }

    if (kind == TS_KIND_URING) {
        pthread_mutex_lock(&e->init_lock);
        while (e->init_done < e->nthreads) pthread_cond_wait(&e->init_cond, &e->init_lock);
        int init_error = e->init_error;
        pthread_mutex_unlock(&e->init_lock);
        if (init_error) {
            stop_threads(e); /* rings that did start drain nothing and exit */
            *err = init_error;
            engine_free(e);
            return NULL;
        }
    }
    return e;
}

/*
 * Queue n requests as one batch; results[i] receives request i's outcome.
 * Returns the batch id (> 0) or -errno. The buffers and results must stay
 * valid until ts_reap has returned the id.
 */
int64_t ts_submit(ts_engine *e, const ts_request *reqs, int64_t n, int64_t *results) {
    if (n < 0) return -EINVAL;
    ts_batch *b = malloc(sizeof(ts_batch));
    if (!b) return -ENOMEM;
    b->results = results;
    b->next = NULL;

    int64_t valid = 0;
    for (int64_t i = 0; i < n; i++) {
        const ts_request *r = &reqs[i];
        if ((r->op != TS_OP_READ && r->op != TS_OP_WRITE) || r->offset < 0 || r->length < 0 || r->fd < 0)
            results[i] = -EINVAL;
        else if (r->length == 0)
            results[i] = 0;
        else
            valid++;
    }
    /* +1 so the batch cannot complete while it is still being queued. */
    atomic_init(&b->remaining, valid + 1);

    pthread_mutex_lock(&e->qlock);
    if (e->stopping) {
        pthread_mutex_unlock(&e->qlock);
        free(b);
        return -ESHUTDOWN;
    }
    int err = queue_reserve(&e->queue, (size_t)valid);
    if (err) {
        pthread_mutex_unlock(&e->qlock);
        free(b);
        return err;
    }
    b->id = e->next_batch_id++;
    for (int64_t i = 0; i < n; i++) {
        const ts_request *r = &reqs[i];
        if ((r->op != TS_OP_READ && r->op != TS_OP_WRITE) || r->offset < 0 || r->length <= 0 || r->fd < 0)
            continue;
        ts_work w = {.req = *r, .done = 0, .batch = b, .index = (uint32_t)i, .retries = 0};
        queue_push_back(&e->queue, &w);
    }
    if (valid) pthread_cond_broadcast(&e->qcond);
    pthread_mutex_unlock(&e->qlock);

    uint64_t id = b->id;
    if (valid) ring_doorbells(e, valid);
    if (atomic_fetch_sub(&b->remaining, 1) == 1) complete_batch(e, b);
    return (int64_t)id;
}

/* Wait up to timeout_ms (negative: forever) for finished batches; returns how many ids were written. */
int64_t ts_reap(ts_engine *e, uint64_t *ids, int64_t max, int64_t timeout_ms) {
    pthread_mutex_lock(&e->dlock);
    if (!e->done_head && timeout_ms != 0) {
        if (timeout_ms < 0) {
            while (!e->done_head) pthread_cond_wait(&e->dcond, &e->dlock);
        } else {
            struct timespec deadline;
            clock_gettime(CLOCK_REALTIME, &deadline);
            deadline.tv_sec += timeout_ms / 1000;
            deadline.tv_nsec += (timeout_ms % 1000) * 1000000L;
            if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
            while (!e->done_head) {
                if (pthread_cond_timedwait(&e->dcond, &e->dlock, &deadline) == ETIMEDOUT) break;
            }
        }
    }
    int64_t got = 0;
    while (e->done_head && got < max) {
        ts_batch *b = e->done_head;
        e->done_head = b->next;
        if (!e->done_head) e->done_tail = NULL;
        ids[got++] = b->id;
        free(b);
    }
    pthread_mutex_unlock(&e->dlock);
    return got;
}

/* Wakes a thread blocked in ts_reap without completing anything (used at shutdown). */
void ts_wake_reapers(ts_engine *e) {
    pthread_mutex_lock(&e->dlock);
    pthread_cond_broadcast(&e->dcond);
    pthread_mutex_unlock(&e->dlock);
}

/* Finishes all queued work, stops the threads, frees the engine. Unreaped batches are freed too. */
void ts_engine_destroy(ts_engine *e) {
    stop_threads(e);
    pthread_mutex_lock(&e->dlock);
    while (e->done_head) {
        ts_batch *b = e->done_head;
        e->done_head = b->next;
        free(b);
    }
    pthread_mutex_unlock(&e->dlock);
    engine_free(e);
}
