"""Communication agents: fetch parameters from the servers and push gradients, off the compute path.

One agent per worker stands in for a SmartNIC. With ``agents="thread"`` it is a
pair of threads inside the worker process that receive parameters straight
into the worker's bucket buffers; with ``agents="process"`` it is a rank of its
own that receives from the servers and relays whole buckets to its worker
(and gradients back), so the worker process runs no network code but the
local relay.

[Note: prefetch window]
An agent delivers fetches in the schedule's order and stays at most
``prefetch`` deliveries ahead of what the compute thread has consumed. Before
receiving into a bucket's buffer it waits until the compute thread has
released that buffer (after its forward, or at the end of the previous step),
so a delivery never overwrites parameters in use.

[Note: gradients in flight]
A worker's backward makes gradient buckets faster than a server whose state
is on the SSD takes them. Queued behind the network, they would pile up on
the worker (at 1.1B, 176 MB a layer: the whole model's gradients by the end of
the backward). The thread agent holds at most ``grad_window`` gradient buckets
that have not left; the compute thread's next push waits for room, and that
wait counts as exposed communication.
"""
from __future__ import annotations

import collections
import queue
import threading
import time

import torch

from terastack import trace
from terastack.disdp.comm import Comm, Kind, Pending, PeerError, tag
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.roles import RoleMap
from terastack.disdp.shutdown import track
from terastack.disdp.worker import WorkerBucket


class AgentCore:
    """The network side of an agent: receive a bucket from the servers, send a gradient bucket onwards."""

    def __init__(self, *, roles: RoleMap, comm: Comm, layout: Layout, worker: int):
        self.roles = roles
        self.comm = comm
        self.layout = layout
        self.worker = worker

    def fetch(self, b: int, phase: int, buf: torch.Tensor, step: int) -> list[Pending]:
        """Post the receives of every server's slice of bucket ``b`` into ``buf``."""
        out = []
        for s in range(self.roles.servers):
            lo, hi = self.layout.shard(b, s)
            out.append(self.comm.irecv(buf[lo:hi], self.roles.server_rank(s), tag(Kind.PARAM, b, phase),
                                       f"parameters of bucket {b} (step {step}) from server {s}"))
        return out

    def push(self, b: int, grad: torch.Tensor, step: int) -> list[Pending]:
        """Send gradient bucket ``b``: whole to the aggregator, or each slice to its server without one."""
        if self.roles.aggregator:
            return [self.comm.isend(grad, self.roles.aggregator_rank, tag(Kind.GRAD, b),
                                    f"gradient of bucket {b} (step {step})")]
        out = []
        for s in range(self.roles.servers):
            lo, hi = self.layout.shard(b, s)
            out.append(self.comm.isend(grad[lo:hi], self.roles.server_rank(s), tag(Kind.GRAD, b),
                                       f"gradient of bucket {b} (step {step}) for server {s}"))
        return out


class _Failure:
    """The first error of an agent thread, re-raised in the compute thread at its next wait."""

    def __init__(self) -> None:
        self.exc: BaseException | None = None

    def set(self, exc: BaseException) -> None:
        if self.exc is None:
            self.exc = exc

    def check(self) -> None:
        if self.exc is not None:
            raise self.exc


class ThreadAgent:
    """The agent as threads in the worker process (the :class:`~terastack.disdp.worker.Link` of a worker)."""

    def __init__(self, core: AgentCore, schedule: Schedule, buckets: list[WorkerBucket], *, first_step: int,
                 steps: int, prefetch: int, timeout_s: float, grad_window: int = 2):
        if grad_window < 1:
            raise ValueError(f"grad_window: must be >= 1, got {grad_window}")
        self.core = core
        self.schedule = schedule
        self.buckets = buckets
        self.prefetch = max(1, prefetch)
        self.timeout_s = timeout_s
        self.first_step = first_step
        self.steps = steps
        self._cond = threading.Condition()
        self._delivered = 0     # fetches landed, counted over the whole run
        self._consumed = 0      # fetches the compute thread has waited for
        self._step_base = 0
        self._failure = _Failure()
        self._stop = False
        self._grads: queue.Queue = queue.Queue()
        self._grad_window = grad_window
        self._grad_room = threading.Semaphore(grad_window)   # [Note: gradients in flight]
        # joined by close() (or, after abort(), when the rank leaves: [Note: a thread inside the network at exit])
        self._fetcher = track(threading.Thread(target=self._guard(self._fetch_loop), name="agent-fetch",
                                               daemon=True))
        self._pusher = track(threading.Thread(target=self._guard(self._push_loop), name="agent-push", daemon=True))
        self._fetcher.start()
        self._pusher.start()

    def _guard(self, loop):
        def run() -> None:
            try:
                loop()
            except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
                self._failure.set(exc)
                with self._cond:
                    self._cond.notify_all()
        return run

    # ------------------------------------------------------ agent threads
    def _fetch_loop(self) -> None:
        """Post each delivery as soon as the window has room and its bucket is free; land them in order."""
        inflight: collections.deque = collections.deque()   # (pendings, start time, fetch, step)

        def land_oldest() -> None:
            pendings, t0, f, step = inflight.popleft()
            self.core.comm.wait_all(pendings)
            trace.interval(f"fetch b{f.bucket}" + (" (bwd)" if f.phase else ""), t0, time.perf_counter(),
                           track="agent")
            with self._cond:
                self._delivered += 1
                self._cond.notify_all()

        def room() -> bool:
            with self._cond:
                return self._delivered + len(inflight) - self._consumed < self.prefetch

        for step in range(self.first_step, self.first_step + self.steps):
            for f in self.schedule.fetch_order:
                bucket = self.buckets[f.bucket]
                # [Note: prefetch window] at most `prefetch` deliveries posted or landed but not yet consumed,
                # and never into a bucket the compute thread still uses.
                while not (room() and bucket.released.is_set()):
                    if inflight:
                        land_oldest()
                        continue
                    with self._cond:
                        ok = self._cond.wait_for(lambda: self._stop or self._delivered - self._consumed
                                                 < self.prefetch, self.timeout_s)
                        if self._stop:
                            return
                    if not ok or not bucket.released.wait(self.timeout_s):
                        raise TimeoutError(f"{self.core.comm.me}: agent waited {self.timeout_s:g} s for worker "
                                           f"{self.core.worker} to consume deliveries / release bucket {f.bucket} "
                                           f"(step {step})")
                bucket.released.clear()
                inflight.append((self.core.fetch(f.bucket, f.phase, bucket.materialize(), step),
                                 time.perf_counter(), f, step))
        while inflight:
            land_oldest()

    def _push_loop(self) -> None:
        while True:
            item = self._grads.get()
            if item is None:
                return
            b, grad, step = item
            t0 = time.perf_counter()
            self.core.comm.wait_all(self.core.push(b, grad, step))
            del item, grad
            self._grad_room.release()
            trace.interval(f"push b{b}", t0, time.perf_counter(), track="agent")

    # ----------------------------------------------- the compute thread's side
    def begin_step(self, step: int) -> None:
        self._step = step
        self._step_base = (step - self.first_step) * len(self.schedule.fetch_order)

    def wait_params(self, slot: int) -> None:
        target = self._step_base + slot + 1
        # Twice the agent's own bound: a delivery that is late because a peer is silent is reported by the
        # agent first, naming that peer; this bound only catches an agent that is itself stuck.
        limit = 2 * self.timeout_s
        with self._cond:
            ok = self._cond.wait_for(lambda: self._failure.exc is not None or self._delivered >= target, limit)
            self._failure.check()
            if not ok:
                f = self.schedule.fetch_order[slot]
                raise TimeoutError(f"{self.core.comm.me}: waited {limit:g} s for the agent to deliver bucket "
                                   f"{f.bucket} ({'backward' if f.phase else 'forward'}, step {self._step})")
            self._consumed = max(self._consumed, target)
            self._cond.notify_all()

    def released(self, bucket: int) -> None:
        pass  # WorkerBucket.free() already signalled the fetch thread

    def push_grad(self, bucket: int, grad: torch.Tensor) -> float:
        self._failure.check()
        t0 = time.perf_counter()
        while not self._grad_room.acquire(timeout=1.0):   # [Note: gradients in flight]
            self._failure.check()
            if time.perf_counter() - t0 >= 2 * self.timeout_s:
                raise TimeoutError(f"{self.core.comm.me}: waited {2 * self.timeout_s:g} s for gradients to leave "
                                   f"before pushing bucket {bucket} (step {self._step})")
        self._grads.put((bucket, grad, self._step))
        return time.perf_counter() - t0

    def end_step(self) -> None:
        self._failure.check()

    def sent(self) -> None:
        """Wait (bounded) until every gradient pushed has left: each holds a permit of the window until sent."""
        taken, t0 = 0, time.perf_counter()
        while taken < self._grad_window:
            if self._grad_room.acquire(timeout=1.0):
                taken += 1
                continue
            self._failure.check()
            if time.perf_counter() - t0 >= 2 * self.timeout_s:
                raise TimeoutError(f"{self.core.comm.me}: gradients not sent within {2 * self.timeout_s:g} s")
        for _ in range(taken):
            self._grad_room.release()

    def abort(self) -> None:
        """Stop without waiting (the compute thread is failing; its error must not wait for the network)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._grads.put(None)

    def close(self) -> None:
        """Wait until every gradient has left (bounded), then stop the threads."""
        self._grads.put(None)
        self._pusher.join(self.timeout_s)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._fetcher.join(self.timeout_s)
        self._failure.check()
        if self._pusher.is_alive():
            raise TimeoutError(f"{self.core.comm.me}: gradients not sent within {self.timeout_s:g} s at shutdown")


class RelayLink:
    """A worker's link to an agent *process*: whole buckets in and out over the local loopback."""

    def __init__(self, comm: Comm, roles: RoleMap, worker: int, schedule: Schedule, buckets: list[WorkerBucket],
                 *, prefetch: int):
        self.comm = comm
        self.agent = roles.agent_rank(worker)
        self.schedule = schedule
        self.buckets = buckets
        self.prefetch = max(1, prefetch)
        self._posted: dict[int, Pending] = {}
        self._next = self._consumed = self._step = 0
        self._sends: list[Pending] = []

    def _post_ahead(self) -> None:
        """Post receives up to ``prefetch`` deliveries ahead, stopping at a bucket still in use."""
        order = self.schedule.fetch_order
        while self._next < min(self._consumed + self.prefetch, len(order)):
            f = order[self._next]
            bucket = self.buckets[f.bucket]
            if bucket.resident:   # still in use; posted once the compute thread releases it
                return
            bucket.released.clear()
            self._posted[self._next] = self.comm.irecv(bucket.materialize(), self.agent,
                                                       tag(Kind.RELAY_PARAM, f.bucket, f.phase),
                                                       f"parameters of bucket {f.bucket} (step {self._step})")
            self._next += 1

    def begin_step(self, step: int) -> None:
        self._step = step
        self.comm.wait_all(self._sends)
        self._sends.clear()
        self._next = self._consumed = 0
        self._post_ahead()

    def wait_params(self, slot: int) -> None:
        self._consumed = max(self._consumed, slot)
        self._post_ahead()
        pending = self._posted.pop(slot, None)
        if pending is None:
            raise RuntimeError(f"{self.comm.me}: delivery {self.schedule.fetch_order[slot]} was never posted: "
                               "its bucket was still in use (schedule and hooks disagree)")
        self.comm.wait(pending)
        self._consumed = slot + 1
        self._post_ahead()

    def released(self, bucket: int) -> None:
        self._post_ahead()

    def push_grad(self, bucket: int, grad: torch.Tensor) -> None:
        self._sends.append(self.comm.isend(grad, self.agent, tag(Kind.RELAY_GRAD, bucket),
                                           f"gradient of bucket {bucket} (step {self._step})"))

    def end_step(self) -> None:
        pass

    def sent(self) -> None:
        self.comm.wait_all(self._sends)
        self._sends.clear()

    def abort(self) -> None:
        pass   # nothing runs in the background: posted operations die with the process

    def close(self) -> None:
        self.comm.wait_all(self._sends)


class AgentProcess:
    """The agent as a rank of its own: servers -> agent -> worker for parameters, and back for gradients."""

    def __init__(self, core: AgentCore, schedule: Schedule, *, prefetch: int):
        self.core = core
        self.schedule = schedule
        self.prefetch = max(1, prefetch)
        self.worker_rank = core.roles.worker_rank(core.worker)

    def step(self, step: int) -> None:
        comm, layout = self.core.comm, self.core.layout
        failure = _Failure()

        def relay_params() -> None:
            try:
                inflight: collections.deque[Pending] = collections.deque()
                for f in self.schedule.fetch_order:
                    buf = torch.empty(layout.buckets[f.bucket].numel)
                    comm.wait_all(self.core.fetch(f.bucket, f.phase, buf, step))
                    inflight.append(comm.isend(buf, self.worker_rank, tag(Kind.RELAY_PARAM, f.bucket, f.phase),
                                               f"parameters of bucket {f.bucket} (step {step}) for its worker"))
                    while len(inflight) > self.prefetch:
                        comm.wait(inflight.popleft())
                comm.wait_all(list(inflight))
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                failure.set(exc)

        fetcher = track(threading.Thread(target=relay_params, name="agent-fetch", daemon=True))
        fetcher.start()
        sends: list[Pending] = []
        # On an error the relay thread is left behind: the error is reported at once, and the rank waits for the
        # thread (briefly) when it leaves ([Note: a thread inside the network at exit] in terastack.disdp.shutdown).
        for b in self.schedule.grad_order:
            grad = torch.empty(layout.buckets[b].numel)
            comm.recv(grad, self.worker_rank, tag(Kind.RELAY_GRAD, b), f"gradient of bucket {b} (step {step})")
            sends += self.core.push(b, grad, step)
            failure.check()
        comm.wait_all(sends)
        fetcher.join(comm.timeout_s)
        failure.check()
        if fetcher.is_alive():
            raise PeerError(f"{comm.me}: parameter relay of step {step} did not finish within {comm.timeout_s:g} s")
