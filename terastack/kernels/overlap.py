"""The overlap figures both proof workloads report, from per-schedule timings of one run."""
from __future__ import annotations

import statistics

SCHEDULES = ("compute_only", "io_only", "sync", "pipelined")


def overlap_figures(times: dict[str, list[float]]) -> dict:
    """Medians per schedule, ``speedup_vs_sync`` and ``hidden_fraction``.

    hidden_fraction = (sync - pipelined) / min(compute_only, io_only): 1.0 when
    the smaller side is completely hidden behind the larger, 0 when nothing is.
    """
    med = {m: statistics.median(times[m]) for m in SCHEDULES}
    return {
        "compute_only_s": med["compute_only"],
        "io_only_s": med["io_only"],
        "sync_s": med["sync"],
        "pipelined_s": med["pipelined"],
        "speedup_vs_sync": med["sync"] / med["pipelined"],
        "hidden_fraction": (med["sync"] - med["pipelined"]) / min(med["compute_only"], med["io_only"]),
    }
