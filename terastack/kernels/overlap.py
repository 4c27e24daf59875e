"""The overlap figures both proof workloads report, from per-schedule timings of one run.

[Note: the share of the smaller side hidden]
Run one after the other, compute and I/O take ``compute + io``; perfectly overlapped, ``max(compute, io)``. What
an overlapped (pipelined) run saves against the serial sum, ``compute + io - pipelined``, is the part of the
smaller side it hid, at most ``min(compute, io)``. So ``smaller_side_hidden`` =
``(compute + io - pipelined) / min(compute, io)``: 1.0 when the smaller side is hidden completely, 0 when nothing
is. The timings are separate runs, so noise can put ``pipelined`` below ``max(compute, io)`` (a ratio above 1) or
above ``compute + io`` (below 0); the figure is clamped to [0, 1] and the unclamped ratio kept beside it.

The synchronous run is not part of it: ``sync - pipelined`` would also credit the synchronous schedule's own
overhead (waits, copies) to the overlap, which is how a share above 1 came about.
"""
from __future__ import annotations

import statistics

SCHEDULES = ("compute_only", "io_only", "sync", "pipelined")


def hidden_share(compute_s: float, io_s: float, pipelined_s: float) -> tuple[float, float]:
    """(share of the smaller side hidden, clamped to [0, 1]; the unclamped ratio). See [Note: the share of the
    smaller side hidden]."""
    smaller = min(compute_s, io_s)
    if smaller <= 0:
        raise ValueError(f"compute_s, io_s: both must be > 0 to say what was hidden, got {compute_s}, {io_s}")
    raw = (compute_s + io_s - pipelined_s) / smaller
    return min(1.0, max(0.0, raw)), raw


def overlap_figures(times: dict[str, list[float]]) -> dict:
    """Medians per schedule, ``speedup_vs_sync`` and ``smaller_side_hidden`` (with its unclamped ratio)."""
    med = {m: statistics.median(times[m]) for m in SCHEDULES}
    hidden, raw = hidden_share(med["compute_only"], med["io_only"], med["pipelined"])
    return {
        "compute_only_s": med["compute_only"],
        "io_only_s": med["io_only"],
        "sync_s": med["sync"],
        "pipelined_s": med["pipelined"],
        "speedup_vs_sync": med["sync"] / med["pipelined"],
        "smaller_side_hidden": hidden,
        "smaller_side_hidden_unclamped": raw,
    }
