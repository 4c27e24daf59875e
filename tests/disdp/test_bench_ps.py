"""One server's throughput as the workers grow, worked out from the jobs' counted step times and bytes."""
import pytest

from terastack.disdp.bench.ps import ps_scaling
from terastack.repro.claims import CLAIMS, REPORTED
from terastack.repro.verdicts import evaluate

RUNS = {1: {"step_s": 0.5, "server_ingress_bytes_per_step": 100},
        2: {"step_s": 0.5, "server_ingress_bytes_per_step": 200},
        4: {"step_s": 1.0, "server_ingress_bytes_per_step": 400}}


def test_rates_and_efficiency():
    s = ps_scaling(RUNS, servers=1, cores=2)
    rows = s["by_workers"]
    assert [rows[w]["worker_gradients_per_s"] for w in ("1", "2", "4")] == pytest.approx([2.0, 4.0, 4.0])
    assert [rows[w]["server_ingress_bytes_per_s"] for w in ("1", "2", "4")] == pytest.approx([200, 400, 400])
    assert [rows[w]["efficiency"] for w in ("1", "2", "4")] == pytest.approx([1.0, 1.0, 0.5])
    assert s["efficiency_at_largest"] == pytest.approx(0.5) and s["speedup_at_largest"] == pytest.approx(2.0)
    assert s["largest_workers"] == 4
    assert s["workers_within_cores"] == 1            # 1 worker + 1 server fill 2 cores
    assert ps_scaling(RUNS, servers=1, cores=16)["workers_within_cores"] == 4
    assert ps_scaling(RUNS, servers=2, cores=2)["workers_within_cores"] == 0


def test_the_claim_reports_the_efficiency():
    claim = next(c for c in CLAIMS if c.id == "disdp.ps_linear")
    result = {"ps_scaling_efficiency": ps_scaling(RUNS, servers=1, cores=2)["efficiency_at_largest"]}
    v = evaluate(claim, "ok", "", result)
    assert v.status == REPORTED and v.measured == pytest.approx(0.5) and "cores" in v.reason


def test_bad_runs_are_refused():
    with pytest.raises(ValueError, match="runs"):
        ps_scaling({}, servers=1, cores=2)
    with pytest.raises(ValueError, match="step_s"):
        ps_scaling({1: {"step_s": 0, "server_ingress_bytes_per_step": 1}}, servers=1, cores=2)
