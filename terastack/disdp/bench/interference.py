"""``terastack bench dist-interference``: a collective's own execution time beside compute and storage traffic,
against the same collective alone.

DisDP's abstract measures it on GPUs: the collectives occupy few of the compute units, "their execution time
increases by 41% due to the serial execution of aggregated CPU/GPU-managed compute (i.e., GEMM), network (i.e.,
NCCL), and storage (i.e., optimizer states)". This measures the same thing on this machine: ``--ranks`` processes
run ``--collectives`` gloo all-reduces of ``--elements`` fp32 values, timed

- alone, just before and just after (the baseline, the mean of the two), and
- beside a compute loop (matrix products of side ``--dim`` on ``--compute-threads`` threads, in this process)
  and storage traffic (a process of its own reading and writing back an optimizer-state file of
  ``--storage-bytes`` in ``--storage-chunk`` pieces through terastack's storage engine, as a CPU optimizer
  streams its state), both running for the whole of the collectives' time.

``collective_time_increase`` is the collectives' time beside over alone, minus 1 (0.41: the paper's 41%).
``collective_cpu_share`` is the share of the machine's cores the collective's processes used while alone (their
CPU seconds, every thread, over the wall time and the cores), the counterpart of the paper's "fewer than 10% of
GPU SMs". The other side of the same interference, terastack's own figure: ``compute_slowdown_beside_collective``,
the compute loop's time per matrix product beside the collective and the storage traffic over its time alone
(timed just before and just after, on its own).

[Note: the phases of a round]
The ranks and the storage process start once per round and wait on barriers and events between phases, so no
process start falls in a timed phase: collective alone, compute alone, all three together, compute alone,
collective alone. In the together phase the storage traffic starts first (the all-reduces wait until it has
moved its first piece), the compute loop starts as the all-reduces do and runs until rank 0 has finished them,
and the storage traffic stops only after that, so the collective never runs without them. Each is a process or
this process's own thread: no two of them share an interpreter lock.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
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
                   help="the optimizer-state file the storage process reads and writes back (default 64MiB; 0: no "
                        "storage traffic, compute alone beside the collective)")
    p.add_argument("--storage-chunk", default="1MiB", help="bytes per read and write of the storage process")
    p.add_argument("--dir", default=None, help="directory of the storage file (default: the system temp dir)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of the five phases (median; default 3)")


def allreduce_rank(rank: int, ranks: int, init_file: str, elements: int, collectives: int, sync, seconds,
                   cpu) -> None:
    """One rank: ``collectives`` all-reduces per collective phase, timed ([Note: the phases of a round])."""
    import torch.distributed as dist

    from terastack.disdp.comm import join_process_group

    torch.set_num_threads(1)
    join_process_group("cpu", rank=rank, world_size=ranks, timeout_s=_WAIT_S, init_method=f"file://{init_file}")
    try:
        buf = torch.zeros(elements)
        for _ in range(min(collectives, 10)):   # connections made and buffers sized before anything is timed
            dist.all_reduce(buf)
        for phase in range(len(_COLLECTIVE_PHASES)):
            sync.go.wait(_WAIT_S)
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(collectives):
                dist.all_reduce(buf)
            seconds[phase * ranks + rank] = time.perf_counter() - t0
            cpu[phase * ranks + rank] = time.process_time() - cpu0
            if rank == 0:
                sync.finished.set()
            sync.done.wait(_WAIT_S)
    finally:
        dist.destroy_process_group()


def storage_traffic(path: str, chunk: int, sync, moved) -> None:
    """Read and write back ``path`` in ``chunk`` pieces, as a CPU optimizer streams its state, from
    ``sync.storage_go`` until ``sync.storage_stop``, setting ``sync.storage_moving`` once the first piece has gone
    both ways; the bytes and seconds into ``moved``."""
    from terastack import io

    buf = io.aligned_empty(chunk)
    with io.open(path, "r+") as f:
        size = f.size
        sync.storage_go.wait(_WAIT_S)
        t0, n = time.perf_counter(), 0
        while not sync.storage_stop.is_set():
            for offset in range(0, size, chunk):
                f.read(buf, offset)      # the state in, updated, and back out: read and write each piece
                f.write(buf, offset)
                if not n:
                    sync.storage_moving.set()   # once: the event is a lock shared between processes
                n += 2 * chunk
                if sync.storage_stop.is_set():
                    break
        moved[0], moved[1] = n, time.perf_counter() - t0


def _compute(a: torch.Tensor, iters: int, label: str) -> float:
    """Seconds per matrix product over ``iters`` of them."""
    out = torch.empty_like(a)
    with tracer.span(label, track="compute", iters=iters):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, a, out=out)
        return (time.perf_counter() - t0) / iters


def _compute_until(a: torch.Tensor, finished) -> tuple[int, float]:
    """(products, seconds) of the compute loop until ``finished`` is set."""
    out = torch.empty_like(a)
    with tracer.span("compute beside the collective and the storage traffic", track="compute"):
        t0, n = time.perf_counter(), 0
        while not finished.is_set():
            torch.mm(a, a, out=out)
            n += 1
        return n, time.perf_counter() - t0


class _Sync:
    """The events and barriers of a round ([Note: the phases of a round])."""

    def __init__(self, ctx, ranks: int):
        self.go, self.done = ctx.Barrier(ranks + 1), ctx.Barrier(ranks + 1)
        self.finished = ctx.Event()                      # rank 0 finished a phase's all-reduces
        self.storage_go, self.storage_stop = ctx.Event(), ctx.Event()
        self.storage_moving = ctx.Event()                # the storage traffic's first piece went in and out

    def abort(self) -> None:
        """Let every process waiting for a phase that will not come leave now, not after _WAIT_S."""
        self.storage_go.set()
        self.storage_stop.set()
        self.go.abort()
        self.done.abort()


def _context():
    """Processes forked from a server that imported torch once: a rank starts in well under a second, where a
    fresh interpreter takes seconds to import torch (and a plain fork would copy this process's thread pools)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _phases(a: torch.Tensor, args: argparse.Namespace, sync: _Sync, storage: bool) -> dict:
    """The five phases, once every process of the round waits for them."""
    def collective(label: str) -> None:
        with tracer.span(label, track="collective"):
            sync.finished.clear()
            sync.go.wait(_WAIT_S)
            sync.done.wait(_WAIT_S)

    collective("collective alone")
    compute_before = _compute(a, args.iters, "compute alone")
    sync.finished.clear()
    if storage:
        sync.storage_go.set()
        # the storage process may still be starting: under load the collectives could otherwise run their whole
        # phase before it moves a byte
        if not sync.storage_moving.wait(_WAIT_S):
            raise RuntimeError(f"the storage process moved nothing within {_WAIT_S:.0f} s")
    sync.go.wait(_WAIT_S)      # the compute starts as the collectives do and runs until they finish
    products, seconds = _compute_until(a, sync.finished)
    sync.storage_stop.set()
    sync.done.wait(_WAIT_S)
    compute_after = _compute(a, args.iters, "compute alone")
    collective("collective alone")
    return {"compute_alone_s": (compute_before + compute_after) / 2, "products_beside": products,
            "compute_beside_s": seconds / products if products else float("inf")}


def _round(a: torch.Tensor, args: argparse.Namespace, tmp: str, round_no: int, state_path: str | None) -> dict:
    """One round of the five phases ([Note: the phases of a round]): the collective's seconds per all-reduce
    alone and beside, the compute's seconds per product alone and beside, the storage traffic's bytes."""
    ctx, n = _context(), args.ranks
    sync = _Sync(ctx, n)
    seconds, cpu = ctx.Array("d", n * len(_COLLECTIVE_PHASES)), ctx.Array("d", n * len(_COLLECTIVE_PHASES))
    moved = ctx.Array("d", 2)
    init_file = os.path.join(tmp, f"store-{round_no}")
    procs = [ctx.Process(target=allreduce_rank, args=(r, n, init_file, args.elements, args.collectives, sync,
                                                      seconds, cpu), daemon=True) for r in range(n)]
    if state_path is not None:
        procs.append(ctx.Process(target=storage_traffic, args=(state_path, args.storage_chunk, sync, moved),
                                 daemon=True))
    for p in procs:
        p.start()
    try:
        compute = _phases(a, args, sync, state_path is not None)
    except BaseException:
        sync.abort()
        raise
    finally:
        for p in procs:
            p.join(_WAIT_S)
        for p in procs:
            if p.is_alive():
                p.kill()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a rank or the storage process failed (exit codes {[p.exitcode for p in procs]})")
    per_op = [statistics.fmean(seconds[ph * n:(ph + 1) * n]) / args.collectives for ph in range(3)]
    wall = [max(seconds[ph * n:(ph + 1) * n]) for ph in range(3)]
    alone = (per_op[0] + per_op[2]) / 2
    cores = len(os.sched_getaffinity(0))
    alone_cpu_share = statistics.fmean(sum(cpu[ph * n:(ph + 1) * n]) / wall[ph] / cores for ph in (0, 2))
    return {"collective_alone_s": alone, "collective_alone_before_s": per_op[0], "collective_alone_after_s": per_op[2],
            "collective_beside_s": per_op[1], "collective_time_increase": per_op[1] / alone - 1,
            "collective_cpu_share": alone_cpu_share,
            "collective_cpu_share_beside": sum(cpu[n:2 * n]) / wall[1] / cores, **compute,
            "compute_slowdown_beside_collective": compute["compute_beside_s"] / compute["compute_alone_s"],
            "storage_bytes_beside": moved[0], "storage_gb_per_s_beside": moved[0] / moved[1] / 1e9 if moved[1] else 0.0,
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


def _state_file(directory: str, storage: int, chunk: int) -> str:
    """The optimizer-state file, written in full (never a sparse file: it would read back zeros for free)."""
    from terastack import io

    path = os.path.join(directory, "optimizer-state.bin")
    buf = io.aligned_empty(chunk)
    rng = torch.Generator().manual_seed(0)
    with io.open(path, "w", size=storage) as f:
        for offset in range(0, storage, chunk):
            buf[:] = torch.randint(0, 256, (chunk,), dtype=torch.uint8, generator=rng).numpy()
            f.write(buf, offset)
        f.sync()
        f.drop_cache()
    return path


def measure(args: argparse.Namespace) -> dict:
    storage, chunk = _check(args)
    args.storage_chunk = chunk
    torch.set_num_threads(args.compute_threads)
    a = torch.randn(args.dim, args.dim, generator=torch.Generator().manual_seed(0))
    _compute(a, max(1, args.iters // 4), "warm-up")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="terastack-interference-", dir=args.dir) as tmp:
        state_path = _state_file(tmp, storage, chunk) if storage else None
        for i in range(args.repeat):
            rounds.append(_round(a, args, tmp, i, state_path))
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
