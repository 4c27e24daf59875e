"""One parameter server's throughput as the workers it serves grow: the figures ``terastack bench dist`` reports.

The runs are the benchmark's server-ingress runs without the aggregator (one
job per worker count, each worker's gradients reaching the server): the server
applies every worker's gradient of every step, so its throughput is the
gradients it takes in per second (``worker_gradients_per_s``: workers / step
time, the same in bytes as ``server_ingress_bytes_per_s``). Linear scalability
means that rate grows with the workers: ``efficiency`` at W workers is the
rate's growth from the fewest workers measured over the growth in workers (1.0:
linear).

[Note: where the cores stop it]
Every worker is a process of its own (its communication agent a thread in it)
and so is every server: beyond ``cores - servers`` workers the processes share
cores, and a step's compute takes longer for that alone, whatever the server
can take in. ``workers_within_cores`` names the last count that had a core per
process; the efficiency at larger counts says as much about the cores as about
the server.
"""
from __future__ import annotations


def ps_scaling(runs: dict[int, dict], *, servers: int, cores: int) -> dict:
    """``runs``: worker count -> a job's ``step_s`` and ``server_ingress_bytes_per_step`` (one server's largest).

    Returns the per-count rates, the efficiency at each count, the efficiency at the largest count and the
    largest count whose processes had a core each ([Note: where the cores stop it]).
    """
    if not runs:
        raise ValueError("runs: need at least one worker count")
    rows = {}
    for w in sorted(runs):
        step = runs[w]["step_s"]
        if not step or step <= 0:
            raise ValueError(f"runs[{w}]: step_s must be > 0, got {step!r}")
        rows[w] = {"step_s": step, "worker_gradients_per_s": w / step,
                   "server_ingress_bytes_per_s": runs[w]["server_ingress_bytes_per_step"] / step}
    base = min(rows)
    for w, row in rows.items():
        row["efficiency"] = (row["worker_gradients_per_s"] / rows[base]["worker_gradients_per_s"]) / (w / base)
    largest = max(rows)
    within = [w for w in rows if w + servers <= cores]
    return {"by_workers": {str(w): row for w, row in rows.items()}, "servers": servers, "cores": cores,
            "largest_workers": largest, "efficiency_at_largest": rows[largest]["efficiency"],
            "speedup_at_largest": rows[largest]["worker_gradients_per_s"] / rows[base]["worker_gradients_per_s"],
            "workers_within_cores": max(within) if within else 0,
            "baseline": f"the same job with {base} worker(s) and the same server"}
