"""``terastack bench dist-interference``: how much a collective running beside a compute loop slows it down.

The disaggregated engine exists because collectives that share a machine with
the compute slow it down. This measures that effect here: a fixed amount of
compute (``--iters`` matrix products on ``--compute-threads`` threads) timed
alone, then while ``--ranks`` processes run gloo all-reduces among themselves on
the same cores, then alone again. ``compute_slowdown_beside_collective`` is the
time beside the collective over the mean of the two alone runs (1.0: no
effect). ``collective_cpu_share`` says what share of the machine's cores the
collective's processes used meanwhile (their CPU seconds, every thread, over
the wall time and the cores), the counterpart of "the compute units a
collective takes".

[Note: stopping the ranks together]
An all-reduce completes only when every rank joins it, so the ranks must stop
after the same iteration: each all-reduce carries a flag in its last element,
set by a rank that has seen the stop event, and every rank leaves the loop after
the all-reduce whose summed flag is non-zero. The buffer holds zeros otherwise,
so its sums stay zero and finite however long the loop runs.
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

HEADLINE = ["compute_slowdown_beside_collective", "collective_cpu_share", "allreduce_gb_per_s"]
PRESETS = {
    "smoke": ["--dim", "128", "--iters", "40", "--elements", "16384", "--repeat", "1"],
    "small": ["--dim", "512", "--iters", "200", "--repeat", "3"],
    "full": ["--dim", "1024", "--iters", "200", "--repeat", "5"],
}
#: seconds any rank or the measuring process waits for the others before giving up
_WAIT_S = 120.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", type=int, default=512, help="side of the square matrices multiplied (default 512)")
    p.add_argument("--iters", type=int, default=200, help="matrix products per timed compute run (default 200)")
    p.add_argument("--compute-threads", type=int, default=1, help="threads of the compute loop (default 1)")
    p.add_argument("--ranks", type=int, default=2, help="processes running the all-reduce (default 2)")
    p.add_argument("--elements", type=int, default=1 << 20,
                   help="fp32 elements per all-reduce (default 1Mi: 4 MiB, a gradient bucket's size)")
    p.add_argument("--repeat", type=int, default=3, help="alone / beside / alone rounds (median; default 3)")


def allreduce_rank(rank: int, ranks: int, init_file: str, elements: int, ready, stop, counts, cpu, wall) -> None:
    """One rank of the collective: all-reduce until the stop event, then report its count and CPU seconds."""
    import torch.distributed as dist

    from terastack.disdp.comm import join_process_group

    torch.set_num_threads(1)
    join_process_group("cpu", rank=rank, world_size=ranks, timeout_s=_WAIT_S, init_method=f"file://{init_file}")
    try:
        buf = torch.zeros(elements)
        dist.all_reduce(buf)
        ready.wait(_WAIT_S)
        n, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while True:     # [Note: stopping the ranks together]
            buf[-1] = 1.0 if stop.is_set() else 0.0
            dist.all_reduce(buf)
            n += 1
            if buf[-1] > 0:
                break
        counts[rank], cpu[rank], wall[rank] = n, time.process_time() - cpu0, time.perf_counter() - t0
    finally:
        dist.destroy_process_group()


def _compute(a: torch.Tensor, iters: int, label: str) -> float:
    out = torch.empty_like(a)
    with tracer.span(label, track="compute", iters=iters):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, a, out=out)
        return time.perf_counter() - t0


def _context():
    """Processes forked from a server that imported torch once: a rank starts in well under a second, where a
    fresh interpreter takes seconds to import torch (and a plain fork would copy this process's thread pools)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _beside(a: torch.Tensor, args: argparse.Namespace, tmp: str, round_no: int) -> dict:
    """The compute loop timed while the ranks all-reduce; the ranks' counts and CPU seconds."""
    ctx = _context()
    ready, stop = ctx.Barrier(args.ranks + 1), ctx.Event()
    counts, cpu, wall = ctx.Array("q", args.ranks), ctx.Array("d", args.ranks), ctx.Array("d", args.ranks)
    init_file = os.path.join(tmp, f"store-{round_no}")
    procs = [ctx.Process(target=allreduce_rank, args=(r, args.ranks, init_file, args.elements, ready, stop,
                                                      counts, cpu, wall), daemon=True) for r in range(args.ranks)]
    for p in procs:
        p.start()
    try:
        ready.wait(_WAIT_S)      # every rank has joined the group and finished one all-reduce
        seconds = _compute(a, args.iters, "compute beside all-reduce")
    finally:
        stop.set()
        for p in procs:
            p.join(_WAIT_S)
        for p in procs:
            if p.is_alive():
                p.kill()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"an all-reduce rank failed (exit codes {[p.exitcode for p in procs]})")
    span = max(wall)
    return {"seconds": seconds, "allreduces": counts[0], "collective_cpu_s": sum(cpu), "collective_wall_s": span,
            "allreduce_bytes": counts[0] * args.elements * 4}


def measure(args: argparse.Namespace) -> dict:
    for name in ("dim", "iters", "compute_threads", "elements", "repeat"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(args, name)}")
    if args.ranks < 2:
        raise ValueError(f"ranks: an all-reduce needs at least 2 ranks, got {args.ranks}")
    torch.set_num_threads(args.compute_threads)
    cores = len(os.sched_getaffinity(0))
    a = torch.randn(args.dim, args.dim, generator=torch.Generator().manual_seed(0))
    _compute(a, max(1, args.iters // 4), "warm-up")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="terastack-interference-") as tmp:
        for i in range(args.repeat):
            before = _compute(a, args.iters, "compute alone")
            beside = _beside(a, args, tmp, i)
            after = _compute(a, args.iters, "compute alone")
            alone = (before + after) / 2
            rounds.append({"alone_s": alone, "alone_before_s": before, "alone_after_s": after, **beside,
                           "slowdown": beside["seconds"] / alone,
                           "collective_cpu_share": beside["collective_cpu_s"] / beside["collective_wall_s"] / cores,
                           "allreduce_gb_per_s": beside["allreduce_bytes"] / beside["collective_wall_s"] / 1e9})
    return {"compute_slowdown_beside_collective": statistics.median(r["slowdown"] for r in rounds),
            "collective_cpu_share": statistics.median(r["collective_cpu_share"] for r in rounds),
            "allreduce_gb_per_s": statistics.median(r["allreduce_gb_per_s"] for r in rounds),
            "baseline": "the same compute loop alone, just before and just after (mean of the two)",
            "cores": cores, "ranks": args.ranks, "compute_threads": args.compute_threads, "dim": args.dim,
            "iters": args.iters, "allreduce_bytes_each": args.elements * 4, "rounds": rounds,
            "note": "compute and collective share this machine's cores; the paper measures GPU kernels beside "
                    "NCCL collectives on the same GPU"}
