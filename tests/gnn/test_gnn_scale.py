"""`terastack bench gnn --scale` at tiny size (it must not claim "larger than RAM"), its disk pre-flight, and
`bench gnn --topology ssd` (the same loss curves as the in-memory baselines)."""
from __future__ import annotations

import json
import shutil

import pytest

from terastack.cli import main
from terastack.gnn.bench.scale import dataset_bytes, default_train_nodes
from terastack.memory import mem_total


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_scale_smoke_at_tiny_size_skips_the_ram_claim(tmp_path, capsys):
    d = tmp_path / "scale"
    # 1% of 40,000 nodes = 400 seeds in batches of 64: 7 batches; the caches are placed from 128 of them and
    # the model's inputs measured on 128 others; the np.memmap contender runs batches 0..4, compared on 2..4
    code, out, err = run_cli(capsys, "bench", "gnn", "--scale", "--nodes", "40000", "--avg-degree", "8",
                             "--feat-dim", "32", "--batch-size", "64", "--fanouts", "5,5", "--hidden", "16",
                             "--budget", "300KiB", "--gen-memory", "64MiB", "--presample-nodes", "128",
                             "--holdout-nodes", "128", "--mmap-warmup-batches", "2", "--mmap-batches", "3",
                             "--mmap-threads", "1,3", "--load-probe-seconds", "0.3", "--disk-probe-seconds", "0.3",
                             "--dir", str(d), "--quiet", "--json", "--cleanup")
    assert code == 0, err
    r = json.loads(out)
    assert "not a scale run" in err and r["scale_run"] is False and r["exceeds_ram"] is False
    # the reproduction report lists the scale claims of a run this small, each with its reason, judging none
    # (the harness's own plumbing for a scale benchmark: tests/repro/test_claims.py runs llm-scale's)
    from terastack.repro.claims import CLAIMS, NOT_MEASURED
    from terastack.repro.verdicts import evaluate

    for claim in (c for c in CLAIMS if c.benchmark == "gnn-scale"):
        v = evaluate(claim, "ok", "", r, "smoke")
        assert v.status == NOT_MEASURED and "tiny size" in v.reason, claim.id
    assert r["train_nodes"] == default_train_nodes(40000) == 400 and r["train_fraction"] == 0.01
    sizes = dataset_bytes(40000, 8, 32, 4, 400)
    assert r["dataset_bytes"] == sizes["total"] < mem_total() == r["mem_total_bytes"]
    assert r["batches"] == 7 and r["epoch_seconds"] > 0
    assert r["seeds_per_s"] == pytest.approx(400 / r["epoch_seconds"])
    assert r["presample"]["seeds"] == 128 and r["tpc"]["holdout"]["seeds"] == 128
    assert 0 < r["peak_rss_bytes"] and r["generation"]["peak_rss_bytes"] > 0
    assert r["ssd_bytes_read"] >= r["feature_ssd_bytes"] + r["topology_ssd_bytes"] > 0
    assert 0 <= r["feature_hit_rate"] < 1 and 0 < r["topology_hit_rate"] < 1
    assert sum(r["split"]["list_bytes"].values()) > 0 and r["topology"]["topology"] == "ssd"
    # the TPC model's topology term: the hold-out read list blocks, and the prediction carries them
    assert r["tpc"]["predicted_topology_blocks_per_batch"] > 0 and r["tpc_prediction_error"] >= 0
    # the model's SSD rate and step: measured while the other ran (the disk alone is reported beside)
    loaded = r["tpc"]["ssd_while_training"]
    full = loaded["full_rate"]
    assert full["steps"] >= 5 and loaded["ssd_rand4k_iops"] == full["ssd_rand4k_iops"] > 0
    assert r["tpc"]["ssd"]["ssd_rand4k_iops"] > 0
    # rows of 128 bytes: one-block reads, priced at the feature file's one-block random reads beside the steps
    # (never above its sequential rate), and the output names that figure
    rate = r["tpc"]["ssd_read_rate"]
    assert "random reads of 4.0 KiB" in rate["source"] and "beside the steps" in rate["source"]
    assert rate["bytes_per_s"] == pytest.approx(min(full["ssd_rand4k_iops"] * 4096,
                                                    r["tpc"]["ssd"]["ssd_read_bytes_per_s"]))
    assert rate["epoch_bytes_per_s"] == pytest.approx(r["ssd_bytes_read"] / r["epoch_seconds"])
    # the step: timed beside reads at the predicted epoch's rate, below the full rate (or at it, when the epoch
    # keeps the disk busy)
    assert all(0 <= k["rate_limit"] < full["ssd_rand4k_iops"] for k in loaded["at_epoch_rate"])
    assert loaded["compute_seconds_per_node"] == (loaded["at_epoch_rate"] or [full])[-1]["compute_seconds_per_node"]
    assert loaded["compute_seconds_per_batch"] == pytest.approx(
        loaded["compute_seconds_per_node"] * r["tpc"]["holdout"]["rows_per_batch"]["node"])
    assert r["tpc"]["stages_seconds_per_batch"]["compute"] == pytest.approx(loaded["compute_seconds_per_batch"])
    assert r["tpc_prediction_error"] == pytest.approx(
        abs(r["tpc_predicted_epoch_seconds"] - r["epoch_seconds"]) / r["epoch_seconds"])
    mm = r["mmap"]
    assert mm["batches_run"] == 5 and mm["window"] == [2, 5] and mm["losses_identical"] is True
    # one np.memmap contender per count of gathering threads; the headline is against the fastest
    runs = mm["by_threads"]
    assert set(runs) == {"1", "3"} and all(run["losses_identical"] and run["batches_run"] == 5 for run in runs.values())
    assert mm["window_seconds"] == min(run["window_seconds"] for run in runs.values())
    assert r["speedup_vs_mmap"] == pytest.approx(mm["window_seconds"] / mm["terastack_window_seconds"])
    assert r["speedup_vs_mmap_by_threads"]["1"] == pytest.approx(runs["1"]["window_seconds"]
                                                                 / mm["terastack_window_seconds"])
    assert mm["epoch_seconds_extrapolated"] == pytest.approx(mm["window_seconds"] / 3 * 7)
    # the same window with the training step left out, terastack's and every contender's
    assert r["loader_speedup_vs_mmap"] == pytest.approx(
        min(run["loader_window_seconds"] for run in runs.values()) / mm["terastack_loader_window_seconds"])
    assert mm["peak_rss_bytes"] > 0 and mm["evicted_pages"] > 0
    # every key the issue names
    assert {"train_nodes", "speedup_vs_mmap", "peak_rss_bytes", "tpc_prediction_error", "seeds_per_s",
            "feature_hit_rate", "topology_hit_rate", "epoch_seconds"} <= set(r)
    assert not d.exists()  # --cleanup


def test_scale_refuses_a_dataset_the_disk_cannot_hold(tmp_path, capsys):
    nodes = 10**10  # 5 TB of features
    code, _, err = run_cli(capsys, "bench", "gnn", "--scale", "--nodes", str(nodes), "--dir", str(tmp_path / "s"),
                           "--quiet")
    free = shutil.disk_usage(tmp_path).free
    assert code != 0 and "disk:" in err and "bytes" in err and str(free)[:6] in err
    assert not (tmp_path / "s").exists()


def test_bench_with_topology_on_ssd_keeps_loss_curves_identical(tmp_path, capsys):
    from terastack.gnn.bench.measure import PRESETS

    code, out, err = run_cli(capsys, "bench", "gnn", *PRESETS["smoke"], "--topology", "ssd", "--indptr", "ssd",
                             "--tpc-rounds", "1", "--dir", str(tmp_path / "b"), "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["loss_curves_identical"] is True
    assert r["topology"]["topology"] == "ssd" and sum(r["topology"]["split"]["list_bytes"].values()) > 0
    assert 0 < r["hit_rates"]["topology"] < 1
