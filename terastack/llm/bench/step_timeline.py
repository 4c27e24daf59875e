"""Where a traced step's time went: compute, waits, and how much of it the disk was busy.

[Note: the step's timeline]
``bench llm-scale`` records a trace of its measured steps (:mod:`terastack.trace`) and reads three figures per
step out of it:

* ``compute_s``: the training thread's work -- its unit spans (forward, backward, recompute, and the updates
  that run inline inside backward; nested spans counted once) less the waits recorded inside them (weights
  not yet arrived, optimizer state not yet read or not yet written back, room in a ledger);
* ``stall_s``: those waits;
* ``update_s``: the optimizer's own work -- its update spans (inline, inside backward's; or on the optimizer's
  thread) less the waits recorded inside them: what the planner prices as the optimizer's time
  (``predicted_optimizer_s``), measured;
* ``disk_busy_share``: the share of the step in which at least one SSD request was in flight (the union of
  the I/O spans over the step).

A step bound by the disk shows a busy share near 1 and compute well below the step; a step that serialises
the two shows compute plus waits near the step and a disk idle much of the time.
"""
from __future__ import annotations


def _merged(intervals) -> list[list[float]]:
    """``intervals`` as disjoint sorted intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(merged) -> float:
    return sum(b - a for a, b in merged)


def _overlap(x: list[list[float]], y: list[list[float]]) -> float:
    """Length of the intersection of two merged interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        total += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def step_timelines(events: list[dict]) -> list[dict]:
    """Per traced step (in order; spans on the ``step`` track): ``step``, ``seconds``, ``compute_s``,
    ``stall_s``, ``update_s`` and ``disk_busy_share`` ([Note: the step's timeline])."""
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]

    def track(e: dict) -> str:
        return lanes.get(e["tid"], "").split("#")[0]

    out = []
    for s in sorted((e for e in spans if track(e) == "step"), key=lambda e: e["ts"]):
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        inside = [e for e in spans if t0 <= e["ts"] < t1]

        def merged(name: str, cat: str | None = None):
            return _merged((e["ts"], min(e["ts"] + e["dur"], t1)) for e in inside
                           if track(e) == name and (cat is None or e.get("cat") == cat))

        # only the waits inside the training thread's unit spans are its waits
        compute, stalls, updates = merged("compute"), merged("stall"), merged("optimizer", "optimizer")
        stall = _overlap(compute, stalls)
        out.append({"step": s["name"], "seconds": s["dur"] / 1e6,
                    "compute_s": max(0.0, _length(compute) - stall) / 1e6, "stall_s": stall / 1e6,
                    "update_s": max(0.0, _length(updates) - _overlap(updates, stalls)) / 1e6,
                    "disk_busy_share": _length(merged("io", "io")) / s["dur"] if s["dur"] > 0 else 0.0})
    return out
