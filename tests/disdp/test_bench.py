"""``terastack bench dist`` at smoke size: every field the issue asks for, measured in one run."""
from __future__ import annotations

import argparse

import pytest

from terastack.disdp import bench


@pytest.mark.timeout(200)
def test_bench_dist_smoke(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(bench.PRESETS["smoke"] + ["--run-dir", str(tmp_path)])
    result = bench.measure(args)
    for system in ("terastack", "fsdp2", "zero3"):
        assert result[f"{system}_step_s"] > 0
        assert 0 <= result[f"{system}_exposed_comm_fraction"] <= 1
        assert result[f"{system}_max_abs_diff"] <= 1e-5        # each equals single-process AdamW
    assert result["worker_optimizer_bytes"] == 0               # terastack workers hold no optimizer state
    assert result["fsdp2_worker_optimizer_bytes"] > 0 and result["zero3_worker_optimizer_bytes"] > 0
    assert result["speedup_vs_fsdp2"] == pytest.approx(result["fsdp2_step_s"] / result["terastack_step_s"])
    ingress = result["server_ingress_bytes_per_step"]
    with_agg, without = ingress["with_aggregator"], ingress["without_aggregator"]
    assert set(with_agg) == set(without) == {"1", "2"}
    # With the aggregator a server receives one gradient's worth per step whatever the number of workers;
    # without it, one per worker.
    assert with_agg["1"] == with_agg["2"] == without["1"]
    assert without["2"] == 2 * without["1"]
    assert result["server_ingress_flat_with_aggregator"] and result["server_ingress_grows_without_aggregator"]


def test_bench_presets_parse():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    for name, argv in bench.PRESETS.items():
        args = parser.parse_args(argv)
        assert args.steps >= 2, name
