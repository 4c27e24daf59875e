"""`terastack gnn gen|import|verify|train|advise` end to end, the importer against its source arrays, and the
benchmark's smoke run."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from terastack import bench as bench_mod
from terastack.cli import main
from terastack.gnn.storage.dataset import open_dataset
from terastack.plan.hardware import Hardware, save_probe


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_gen_verify_train_advise(tmp_path, capsys):
    data = tmp_path / "d"
    code, out, _ = run_cli(capsys, "gnn", "gen", "--out", str(data), "--nodes", "4000", "--feat-dim", "8",
                           "--classes", "3", "--quiet")
    assert code == 0 and "generated" in out
    code, out, _ = run_cli(capsys, "gnn", "verify", "--data", str(data), "--json")
    assert code == 0 and json.loads(out)["verified"] == "checksums (full)"
    trace = tmp_path / "trace.json"
    code, out, err = run_cli(capsys, "gnn", "train", "--data", str(data), "--fanouts", "4,4", "--batch-size", "64",
                             "--epochs", "2", "--hidden", "16", "--host-cache", "24KiB", "--device-cache", "2KiB",
                             "--json", "--quiet", "--trace", str(trace))
    assert code == 0, err
    result = json.loads(out)
    assert len(result["epochs"]) == 2 and result["accuracy"] is not None
    assert 0 < result["epochs"][0]["miss_rate"] < 1
    code, out, err = run_cli(capsys, "gnn", "train", "--data", str(data), "--fanouts", "4,4", "--batch-size", "64",
                             "--epochs", "2", "--hidden", "16", "--host-cache", "40KiB", "--device-cache", "2KiB",
                             "--topology", "ssd", "--indptr", "ssd", "--json", "--quiet")
    assert code == 0, err
    on_ssd = json.loads(out)
    assert on_ssd["loss_curve"] == result["loss_curve"]  # same batches whichever way the topology is read
    assert on_ssd["topology"]["indptr"] == "ssd" and on_ssd["epochs"][0]["topology_ssd_bytes"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"sample", "gather", "train", "io"} <= lanes
    probe = tmp_path / "probe.json"
    save_probe(Hardware(name="test box", cores=2, cpu_flops=5e10, memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=2e9,
                        ssd_rand4k_iops=80_000), probe)
    code, out, err = run_cli(capsys, "gnn", "advise", "--data", str(data), "--probe", str(probe), "--fanouts", "4,4",
                             "--batch-size", "64", "--hidden", "16", "--ssds", "1,2", "--memory", "64,128",
                             "--gpus", "none,RTX 4090", "--json")
    assert code == 0, err
    advice = json.loads(out)
    assert len(advice["candidates"]) == 2 * 2 * 2
    assert advice["best"]["epochs_per_usd"] == max(c["epochs_per_usd"] for c in advice["candidates"])
    assert advice["this_machine"]["epoch_seconds"] > 0 and advice["this_machine"]["bottleneck"]
    # rows of 32 bytes: one-block reads, priced at the dataset's own file's figure, which the output names; the
    # price table's spec-sheet SSD has no figure per request size
    assert "random reads of 4.0 KiB" in advice["this_machine"]["ssd_read_rate"]["source"]
    assert advice["this_machine"]["ssd_read_rate"]["measured_at_request_size"] is True
    assert all(c["ssd_rate_source"].startswith("min(sequential read") for c in advice["candidates"])


def test_advise_prices_wide_rows_at_the_probes_figure_for_their_extent(tmp_path, capsys):
    data = tmp_path / "d"
    # rows of 1500 fp32 = 6000 bytes: a missed row is an extent of about 2.5 blocks, which one-block reads of the
    # feature file do not measure; the probe's random reads of 4 and 16 KiB at the engine's depth do
    assert run_cli(capsys, "gnn", "gen", "--out", str(data), "--nodes", "600", "--feat-dim", "1500",
                   "--classes", "3", "--quiet")[0] == 0
    from terastack.io import get_engine

    depth = get_engine().config.queue_depth
    figures = [{"request_bytes": 4096, "queue_depth": depth, "reads_per_s": 50_000.0},
               {"request_bytes": 16384, "queue_depth": depth, "reads_per_s": 30_000.0}]
    probe = tmp_path / "probe.json"
    save_probe(Hardware(name="probe box", cores=2, cpu_flops=5e10, memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=2e9,
                        ssd_rand4k_iops=80_000, ssd_random_reads=figures), probe)
    argv = ["gnn", "advise", "--data", str(data), "--probe", str(probe), "--fanouts", "3,3", "--batch-size", "32",
            "--hidden", "8", "--ssds", "1", "--memory", "64", "--gpus", "none", "--calibration-steps", "1"]
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    rate = json.loads(out)["this_machine"]["ssd_read_rate"]
    assert rate["measured_at_request_size"] is True and 4096 < rate["request_bytes"] < 16384
    assert f"queue depth {depth} (probe box" in rate["source"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and "SSD reads priced at" in out and "probe box" in out


def test_cli_bad_input_is_one_clear_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "gnn", "train", "--data", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err and "Traceback" not in err
    data = tmp_path / "d"
    run_cli(capsys, "gnn", "gen", "--out", str(data), "--nodes", "500", "--feat-dim", "4", "--quiet")
    code, _, err = run_cli(capsys, "gnn", "train", "--data", str(data), "--fanouts", "5,0")
    assert code == 2 and "fanouts" in err
    code, _, err = run_cli(capsys, "gnn", "train", "--data", str(data), "--host-cache", "900TiB", "--quiet")
    assert code == 2 and "host" in err and "budget" in err
    code, _, err = run_cli(capsys, "gnn", "advise", "--data", str(data), "--prices", str(tmp_path / "none.toml"))
    assert code == 2 and "prices" in err


def test_help_lists_every_gnn_action(capsys):
    import argparse

    from terastack.gnn.cli import add_arguments

    parser = argparse.ArgumentParser(prog="terastack gnn")
    add_arguments(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = list(sub.choices)  # the reference: the actions `terastack gnn` really takes
    assert {"gen", "import", "verify", "train", "infer", "advise"} <= set(actions)
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    entry = top[top.index("    gnn "):]
    entry = " ".join(entry[:entry.index("\n    dist ")].split())  # its help line, however argparse wraps it
    assert all(f" {a}" in entry for a in actions), entry
    with pytest.raises(SystemExit):
        main(["gnn", "--help"])
    listed = capsys.readouterr().out
    assert all(f"    {a} " in listed for a in actions), listed


def test_save_model_writes_its_description_beside_it_as_path_json(tmp_path, capsys):
    data = tmp_path / "d"
    run_cli(capsys, "gnn", "gen", "--out", str(data), "--nodes", "300", "--feat-dim", "4", "--classes", "3", "--quiet")
    ckpt = tmp_path / "m.pt"
    code, _, err = run_cli(capsys, "gnn", "train", "--data", str(data), "--fanouts", "3", "--batch-size", "64",
                           "--epochs", "1", "--hidden", "8", "--eval-nodes", "0", "--save-model", str(ckpt), "--quiet")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "m.pt", "m.pt.json"]
    infer = ["gnn", "infer", "--data", str(data), "--checkpoint", str(ckpt), "--out", str(tmp_path / "p.npy"),
             "--quiet", "--json"]
    code, out, err = run_cli(capsys, *infer)
    assert code == 0, err
    first = np.load(tmp_path / "p.npy")
    # a checkpoint written before (its description as m.json) is still read
    (tmp_path / "m.pt.json").rename(tmp_path / "m.json")
    (tmp_path / "p.npy").unlink()
    code, out, err = run_cli(capsys, *infer)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), first)


def _ogb_dir(root, n=700, e=2500, f=6, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    root.mkdir()
    (root / "split").mkdir()
    edge_index = rng.integers(0, n, (2, e))
    feats = rng.standard_normal((n, f))  # float64: stored as float32
    labels = rng.integers(0, classes, (n, 1))
    perm = rng.permutation(n)
    np.save(root / "edge_index.npy", edge_index)
    np.save(root / "node_feat.npy", feats)
    np.save(root / "node_label.npy", labels)
    for name, ids in (("train", perm[:300]), ("valid", perm[300:400]), ("test", perm[400:500])):
        np.save(root / "split" / f"{name}.npy", ids)
    return edge_index, feats, labels[:, 0], perm


def test_import_ogb_style_arrays_matches_the_sources(tmp_path, capsys, reference_csc):
    src = tmp_path / "ogb"
    edge_index, feats, labels, perm = _ogb_dir(src)
    out = tmp_path / "imported"
    code, _, err = run_cli(capsys, "gnn", "import", "--ogb-dir", str(src), "--out", str(out), "--undirected",
                           "--quiet", "--memory-budget", "32MiB")
    assert code == 0, err
    ds = open_dataset(out)
    np.testing.assert_array_equal(ds.read_features(), feats.astype(np.float32))
    np.testing.assert_array_equal(ds.labels, labels)
    s, d = edge_index
    ref_ptr, ref_idx = reference_csc(np.concatenate([s, d]), np.concatenate([d, s]), 700, drop_self_loops=False)
    np.testing.assert_array_equal(ds.indptr, ref_ptr)
    np.testing.assert_array_equal(ds.indices, ref_idx)
    np.testing.assert_array_equal(ds.splits["train"], np.sort(perm[:300]))
    np.testing.assert_array_equal(ds.splits["val"], np.sort(perm[300:400]))
    # CSC input gives the same dataset (directed here)
    ptr, idx = reference_csc(s, d, 700, drop_self_loops=False)
    np.save(tmp_path / "indptr.npy", ptr)
    np.save(tmp_path / "indices.npy", idx)
    code, _, err = run_cli(capsys, "gnn", "import", "--indptr", str(tmp_path / "indptr.npy"), "--indices",
                           str(tmp_path / "indices.npy"), "--features", str(src / "node_feat.npy"), "--labels",
                           str(src / "node_label.npy"), "--train-idx", str(src / "split" / "train.npy"),
                           "--out", str(tmp_path / "csc"), "--quiet")
    assert code == 0, err
    csc = open_dataset(tmp_path / "csc")
    np.testing.assert_array_equal(csc.indptr, ptr)
    np.testing.assert_array_equal(csc.indices, idx)


def test_import_bad_inputs_name_the_file(tmp_path, capsys):
    src = tmp_path / "ogb"
    _ogb_dir(src)
    np.save(src / "pickled.npy", np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    code, _, err = run_cli(capsys, "gnn", "import", "--ogb-dir", str(src), "--features", str(src / "pickled.npy"),
                           "--out", str(tmp_path / "a"), "--quiet")
    assert code == 2 and "pickled.npy" in err and "unpickling" in err
    bad = np.load(src / "edge_index.npy")
    bad[1, 17] = 700
    np.save(src / "bad_edges.npy", bad)
    code, _, err = run_cli(capsys, "gnn", "import", "--ogb-dir", str(src), "--edge-index", str(src / "bad_edges.npy"),
                           "--out", str(tmp_path / "b"), "--quiet")
    assert code == 2 and "bad_edges.npy: node id 700 of edge 17 is out of range" in err
    np.save(src / "short_labels.npy", np.zeros(10, np.int64))
    code, _, err = run_cli(capsys, "gnn", "import", "--ogb-dir", str(src), "--labels", str(src / "short_labels.npy"),
                           "--out", str(tmp_path / "c"), "--quiet")
    assert code == 2 and "short_labels.npy: labels must have one entry per node" in err
    assert pickle  # (the object array above was written with pickle on purpose; it must never be read back)


def test_bench_smoke(tmp_path, capsys):
    argv = ["bench", "gnn", *bench_mod_presets()["smoke"], "--dir", str(tmp_path / "bench"), "--json"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    r = json.loads(out)
    assert r["loss_curves_identical"] is True and r["accuracy_diff_points"] == 0.0
    assert r["feature_to_budget_ratio"] >= 4
    assert len(r["prediction_error"]) == 3 and all(e >= 0 for e in r["prediction_error"])
    for key in ("slowdown_vs_in_memory_pipelined", "slowdown_vs_in_memory_serial", "slowdown_vs_in_memory",
                "speedup_vs_mmap", "speedup_vs_sync_gather"):
        assert r[key] > 0
    # the older key is the serial figure; the pipelined baseline trains on the same batches
    assert r["slowdown_vs_in_memory"] == r["slowdown_vs_in_memory_serial"]
    assert r["in_memory_pipelined_accuracy"] == r["in_memory_accuracy"]
    assert r["ssd"]["calls_per_batch"] == pytest.approx(1.0) and r["hit_rates"]["miss"] > 0
    assert r["mmap"]["evicted_pages"] > 0


def bench_mod_presets():
    from terastack.gnn.bench import measure as bench

    assert "gnn" in {c.name for c in bench_mod.BENCHMARKS}
    return bench.PRESETS
