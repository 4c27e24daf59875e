"""`terastack bench gnn --scale` at tiny size (it must not claim "larger than RAM"), its disk pre-flight, and
`bench gnn --topology ssd` (the same loss curves as the in-memory baselines)."""
from __future__ import annotations

import json
import shutil

from terastack.cli import main
from terastack.gnn.scale import dataset_bytes
from terastack.memory import mem_total


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_scale_smoke_at_tiny_size_skips_the_ram_claim(tmp_path, capsys):
    d = tmp_path / "scale"
    code, out, err = run_cli(capsys, "bench", "gnn", "--scale", "--nodes", "20000", "--avg-degree", "8",
                             "--feat-dim", "32", "--train-nodes", "512", "--batch-size", "128", "--fanouts", "5,5",
                             "--hidden", "16", "--budget", "200KiB", "--gen-memory", "64MiB", "--dir", str(d),
                             "--quiet", "--json", "--cleanup")
    assert code == 0, err
    r = json.loads(out)
    assert "not a scale run" in err and r["scale_run"] is False and r["exceeds_ram"] is False
    sizes = dataset_bytes(20000, 8, 32, 4, 512)
    assert r["dataset_bytes"] == sizes["total"] < mem_total() == r["mem_total_bytes"]
    assert r["train_nodes"] == 512 and r["batches"] == 4 and r["epoch_seconds"] > 0
    assert 0 < r["peak_rss_bytes"] and r["generation"]["peak_rss_bytes"] > 0
    assert r["ssd_bytes_read"] >= r["feature_ssd_bytes"] + r["topology_ssd_bytes"] > 0
    assert 0 <= r["feature_hit_rate"] < 1 and 0 < r["topology_hit_rate"] < 1
    assert r["split"]["topology_bytes"] > 0 and r["tpc_prediction_error"] >= 0
    assert r["topology"]["topology"] == "ssd"
    assert not d.exists()  # --cleanup


def test_scale_refuses_a_dataset_the_disk_cannot_hold(tmp_path, capsys):
    nodes = 10**10  # 5 TB of features
    code, _, err = run_cli(capsys, "bench", "gnn", "--scale", "--nodes", str(nodes), "--dir", str(tmp_path / "s"),
                           "--quiet")
    free = shutil.disk_usage(tmp_path).free
    assert code != 0 and "disk:" in err and "bytes" in err and str(free)[:6] in err
    assert not (tmp_path / "s").exists()


def test_bench_with_topology_on_ssd_keeps_loss_curves_identical(tmp_path, capsys):
    from terastack.gnn.bench import PRESETS

    code, out, err = run_cli(capsys, "bench", "gnn", *PRESETS["smoke"], "--topology", "ssd", "--indptr", "ssd",
                             "--tpc-rounds", "1", "--dir", str(tmp_path / "b"), "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["loss_curves_identical"] is True
    assert r["topology"]["topology"] == "ssd" and r["topology"]["split"]["topology_bytes"] > 0
    assert 0 < r["hit_rates"]["topology"] < 1
