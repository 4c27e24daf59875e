"""``terastack bench dist-interference``: a collective's own execution time beside compute and storage traffic,
against the same collective alone.

DisDP's abstract measures it on GPUs: the collectives occupy few of the compute units, "their execution time
increases by 41% due to the serial execution of aggregated CPU/GPU-managed compute (i.e., GEMM), network (i.e.,
NCCL), and storage (i.e., optimizer states)". This measures the same thing on this machine: ``--ranks`` processes
run ``--collectives`` gloo all-reduces of ``--elements`` fp32 values, timed

- alone, just before and just after (the baseline, the mean of the two), and
- beside a compute loop (matrix products of side ``--dim`` on ``--compute-threads`` threads) and storage traffic
  (a thread reading and writing back an optimizer-state file of ``--storage-bytes`` in ``--storage-chunk``
  pieces through terastack's storage engine, as a CPU optimizer streams its state), both running for the whole
  of the collectives' time.

``collective_time_increase`` is the collectives' time beside over alone, minus 1 (0.41: the paper's 41%).
``collective_cpu_share`` is the share of the machine's cores the collective's processes used while alone (their
CPU seconds, every thread, over the wall time and the cores), the counterpart of the paper's "fewer than 10% of
GPU SMs". The other side of the same interference, terastack's own figure: ``compute_slowdown_beside_collective``,
the compute loop's time per matrix product beside the collective and the storage traffic over its time alone
(timed just before and just after, on its own).

[Note: the phases of a round]
The ranks start once per round and wait on a barrier between phases, so no process start falls in a timed
phase: collective alone, compute alone, all three together, compute alone, collective alone. In the together
phase the compute and storage threads start first and stop only after the last all-reduce, so the collective
never runs without them.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time

import torch

from terastack.trace import tracer
from terastack.units import format_bytes, parse_bytes

HEADLINE = ["collective_time_increase", "collective_cpu_share", "compute_slowdown_beside_collective",
            "storage_gb_per_s_beside", "allreduce_gb_per_s"]
PRESETS = {
    "smoke": ["--dim", "128", "--iters", "40", "--elements", "16384", "--collectives", "20", "--storage-bytes",
              "4MiB", "--repeat", "1"],
    "small": ["--dim", "512", "--iters", "200", "--collectives", "50", "--storage-bytes", "64MiB", "--repeat", "3"],
    "full": ["--dim", "1024", "--iters", "200", "--collectives", "100", "--storage-bytes", "256MiB", "--repeat", "5"],
}
#: seconds any rank or the measuring process waits for the others before giving up
_WAIT_S = 120.0
#: phases in which the ranks run their all-reduces ([Note: the phases of a round])
_COLLECTIVE_PHASES = ("alone_before", "beside", "alone_after")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", type=int, default=512, help="side of the square matrices multiplied (default 512)")
    p.add_argument("--iters", type=int, default=200, help="matrix products per timed compute-alone run (default 200)")
    p.add_argument("--compute-threads", type=int, default=1, help="threads of the compute loop (default 1)")
    p.add_argument("--ranks", type=int, default=2, help="processes running the all-reduce (default 2)")
    p.add_argument("--elements", type=int, default=1 << 20,
                   help="fp32 elements per all-reduce (default 1Mi: 4 MiB, a gradient bucket's size)")
    p.add_argument("--collectives", type=int, default=50, help="all-reduces per timed collective phase (default 50)")
    p.add_argument("--storage-bytes", default="64MiB",
                   help="the optimizer-state file the storage thread reads and writes back (default 64MiB; 0: no "
                        "storage traffic, compute alone beside the collective)")
    p.add_argument("--storage-chunk", default="1MiB", help="bytes per read and write of the storage thread")
    p.add_argument("--dir", default=None, help="directory of the storage file (default: the system temp dir)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of the five phases (median; default 3)")


def allreduce_rank(rank: int, ranks: int, init_file: str, elements: int, collectives: int, go, done, quit_,
                   seconds, cpu) -> None:
    """One rank: ``collectives`` all-reduces per collective phase, timed ([Note: the phases of a round])."""
    import torch.distributed as dist

    from terastack.disdp.comm import join_process_group

    torch.set_num_threads(1)
    join_process_group("cpu", rank=rank, world_size=ranks, timeout_s=_WAIT_S, init_method=f"file://{init_file}")
    try:
        buf = torch.zeros(elements)
        dist.all_reduce(buf)     # the connections are made before anything is timed
        for phase in range(len(_COLLECTIVE_PHASES)):
            go.wait(_WAIT_S)
            if quit_.is_set():
                return
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(collectives):
                dist.all_reduce(buf)
            seconds[phase * ranks + rank] = time.perf_counter() - t0
            cpu[phase * ranks + rank] = time.process_time() - cpu0
            done.wait(_WAIT_S)
    finally:
        dist.destroy_process_group()


def _compute(a: torch.Tensor, iters: int, label: str) -> float:
    """Seconds per matrix product over ``iters`` of them."""
    out = torch.empty_like(a)
    with tracer.span(label, track="compute", iters=iters):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, a, out=out)
        return (time.perf_counter() - t0) / iters


class _Background:
    """The compute loop and the storage traffic, each on its own thread until :meth:`stop`."""

    def __init__(self, a: torch.Tensor, state_file, chunk: int):
        self.a, self.file, self.chunk = a, state_file, chunk
        self.stopping = threading.Event()
        self.products = 0
        self.storage_bytes = 0
        self.threads = [threading.Thread(target=self._compute, name="compute", daemon=True)]
        if state_file is not None:
            self.threads.append(threading.Thread(target=self._storage, name="storage", daemon=True))

    def _compute(self) -> None:
        out = torch.empty_like(self.a)
        while not self.stopping.is_set():
            torch.mm(self.a, self.a, out=out)
            self.products += 1

    def _storage(self) -> None:
        from terastack import io

        buf = io.aligned_empty(self.chunk)
        size = self.file.size
        while not self.stopping.is_set():
            for offset in range(0, size, self.chunk):
                if self.stopping.is_set():
                    return
                self.file.read(buf, offset)      # the state in, updated, and back out: read and write each piece
                self.file.write(buf, offset)
                self.storage_bytes += 2 * self.chunk

    def __enter__(self) -> "_Background":
        self.t0 = time.perf_counter()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(_WAIT_S)
        self.seconds = time.perf_counter() - self.t0


def _context():
    """Processes forked from a server that imported torch once: a rank starts in well under a second, where a
    fresh interpreter takes seconds to import torch (and a plain fork would copy this process's thread pools)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _round(a: torch.Tensor, args: argparse.Namespace, tmp: str, round_no: int, state_file) -> dict:
    """One round of the five phases ([Note: the phases of a round]): the collective's seconds per all-reduce
    alone and beside, the compute's seconds per product alone and beside, the storage thread's bytes."""
    ctx, n = _context(), args.ranks
    go, done, quit_ = ctx.Barrier(n + 1), ctx.Barrier(n + 1), ctx.Event()
    seconds, cpu = ctx.Array("d", n * len(_COLLECTIVE_PHASES)), ctx.Array("d", n * len(_COLLECTIVE_PHASES))
    init_file = os.path.join(tmp, f"store-{round_no}")
    procs = [ctx.Process(target=allreduce_rank, args=(r, n, init_file, args.elements, args.collectives, go, done,
                                                      quit_, seconds, cpu), daemon=True) for r in range(n)]
    for p in procs:
        p.start()

    def collective() -> None:
        go.wait(_WAIT_S)
        done.wait(_WAIT_S)

    try:
        with tracer.span("collective alone", track="collective"):
            collective()
        compute_before = _compute(a, args.iters, "compute alone")
        with _Background(a, state_file, args.storage_chunk) as load:
            with tracer.span("collective beside compute and storage", track="collective"):
                collective()
        compute_after = _compute(a, args.iters, "compute alone")
        with tracer.span("collective alone", track="collective"):
            collective()
    except BaseException:
        quit_.set()
        go.abort()       # ranks waiting for a phase that will not come leave now, not after _WAIT_S
        done.abort()
        raise
    finally:
        quit_.set()
        for p in procs:
            p.join(_WAIT_S)
        for p in procs:
            if p.is_alive():
                p.kill()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"an all-reduce rank failed (exit codes {[p.exitcode for p in procs]})")
    per_op = [statistics.fmean(seconds[ph * n:(ph + 1) * n]) / args.collectives for ph in range(3)]
    wall = [max(seconds[ph * n:(ph + 1) * n]) for ph in range(3)]
    alone, compute_alone = (per_op[0] + per_op[2]) / 2, (compute_before + compute_after) / 2
    beside_compute = load.seconds / load.products if load.products else float("inf")
    cores = len(os.sched_getaffinity(0))
    alone_cpu_share = statistics.fmean(sum(cpu[ph * n:(ph + 1) * n]) / wall[ph] / cores for ph in (0, 2))
    return {"collective_alone_s": alone, "collective_alone_before_s": per_op[0], "collective_alone_after_s": per_op[2],
            "collective_beside_s": per_op[1], "collective_time_increase": per_op[1] / alone - 1,
            "collective_cpu_share": alone_cpu_share,
            "collective_cpu_share_beside": sum(cpu[n:2 * n]) / wall[1] / cores,
            "compute_alone_s": compute_alone, "compute_beside_s": beside_compute,
            "compute_slowdown_beside_collective": beside_compute / compute_alone,
            "products_beside": load.products, "storage_bytes_beside": load.storage_bytes,
            "storage_gb_per_s_beside": load.storage_bytes / load.seconds / 1e9,
            "allreduce_gb_per_s": args.elements * 4 / alone / 1e9}


def _check(args: argparse.Namespace) -> tuple[int, int]:
    for name in ("dim", "iters", "compute_threads", "elements", "collectives", "repeat"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(args, name)}")
    if args.ranks < 2:
        raise ValueError(f"ranks: an all-reduce needs at least 2 ranks, got {args.ranks}")
    storage = parse_bytes(args.storage_bytes, field="storage_bytes")
    chunk = parse_bytes(args.storage_chunk, field="storage_chunk")
    if chunk < 4096 or chunk % 4096:
        raise ValueError(f"storage_chunk: must be a positive multiple of 4 KiB, got {args.storage_chunk}")
    if storage and (storage < chunk or storage % chunk):
        raise ValueError(f"storage_bytes: must be 0 or a multiple of storage_chunk ({format_bytes(chunk)}), got "
                         f"{args.storage_bytes}")
    return storage, chunk


def _state_file(directory: str, storage: int, chunk: int):
    """The optimizer-state file, written in full (never a sparse file: it would read back zeros for free)."""
    from terastack import io

    path = os.path.join(directory, "optimizer-state.bin")
    f = io.open(path, "w", size=storage)
    buf = io.aligned_empty(chunk)
    rng = torch.Generator().manual_seed(0)
    for offset in range(0, storage, chunk):
        buf[:] = torch.randint(0, 256, (chunk,), dtype=torch.uint8, generator=rng).numpy()
        f.write(buf, offset)
    f.sync()
    f.drop_cache()
    return f


def measure(args: argparse.Namespace) -> dict:
    storage, chunk = _check(args)
    args.storage_chunk = chunk
    torch.set_num_threads(args.compute_threads)
    a = torch.randn(args.dim, args.dim, generator=torch.Generator().manual_seed(0))
    _compute(a, max(1, args.iters // 4), "warm-up")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="terastack-interference-", dir=args.dir) as tmp:
        state_file = _state_file(tmp, storage, chunk) if storage else None
        try:
            for i in range(args.repeat):
                rounds.append(_round(a, args, tmp, i, state_file))
        finally:
            if state_file is not None:
                state_file.close()
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return {**{k: median[k] for k in HEADLINE}, "collective_alone_s": median["collective_alone_s"],
            "collective_beside_s": median["collective_beside_s"],
            "baseline": "the same all-reduces alone, just before and just after (mean of the two)",
            "compute_baseline": "the same compute loop alone, just before and just after (mean of the two)",
            "cores": len(os.sched_getaffinity(0)), "ranks": args.ranks, "compute_threads": args.compute_threads,
            "dim": args.dim, "iters": args.iters, "collectives": args.collectives,
            "allreduce_bytes_each": args.elements * 4, "storage_file_bytes": storage, "storage_chunk_bytes": chunk,
            "rounds": rounds,
            "note": "collective, compute and storage traffic share this machine's cores; the paper measures NCCL "
                    "collectives beside GEMM kernels and optimizer-state traffic on GPUs"}
