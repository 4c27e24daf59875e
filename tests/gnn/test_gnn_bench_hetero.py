"""``terastack bench gnn --hetero`` at tiny size, and its IGBH-shaped generator against a reference built from
the generator's own edge streams."""
from __future__ import annotations

from terastack.gnn.storage.dataset import open_dataset

import json

import numpy as np
import pytest

from terastack.cli import main
from terastack.gnn.storage.gen import IGBH_RELATIONS, HeteroGraphGenerator


def _reference_csc(src: np.ndarray, dst: np.ndarray, n_dst: int) -> tuple[np.ndarray, np.ndarray]:
    """In-neighbour lists of every dst node, sorted, duplicates merged (what the CSC build keeps)."""
    pairs = np.unique(np.stack([dst, src], axis=1), axis=0)
    indptr = np.zeros(n_dst + 1, np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n_dst), out=indptr[1:])
    return indptr, pairs[:, 1]


def test_hetero_generator_writes_igbh_shaped_relations_and_their_reverses(tmp_path):
    gen = HeteroGraphGenerator(HeteroGraphGenerator.Config(out=str(tmp_path / "g"), papers=700, feat_dim=8,
                                                           train_nodes=200, test_nodes=100, progress=False))
    result = gen.run()
    ds = open_dataset(tmp_path / "g", verify="full")
    counts = gen.node_counts()
    assert ds.node_counts == counts and set(counts) == {"paper", "author", "institute", "fos"}
    assert ds.target == "paper" and all(ds.feature_dims[t] == 8 for t in counts)
    reverses = {(d, f"rev_{r}", s) for s, r, d in IGBH_RELATIONS if s != d}
    assert set(ds.edge_types) == set(IGBH_RELATIONS) | reverses
    source = gen.source()
    for et, rel in source.relations.items():
        src, dst = (np.concatenate(a) for a in zip(*rel.edge_blocks(0, 1 << 16)))
        assert len(src) == gen.edge_counts()[et]
        if et[0] == et[2]:  # within one type: stored both ways
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        for written, (s, d) in ((et, (src, dst)), ((et[2], f"rev_{et[1]}", et[0]), (dst, src))):
            if written not in ds.topologies:
                continue
            indptr, indices = _reference_csc(s, d, counts[written[2]])
            topo = ds.topologies[written]
            assert (np.asarray(topo.indptr) == indptr).all() and (np.asarray(topo.indices) == indices).all()
    assert len(ds.splits["train"]) == 200 and len(ds.splits["test"]) == 100 and result["status"] == "imported"
    # features: rows streamed from any row equal the rows streamed from the start (resumed builds match)
    blocks = source.node_types["author"].feature_blocks
    whole = np.concatenate(list(blocks(0, 64)))
    assert (np.concatenate(list(blocks(777, 64))) == whole[777:]).all()
    assert (ds.read_type_features("author") == whole).all()
    ds.close()


def test_hetero_generator_config_names_the_field():
    with pytest.raises(ValueError, match="train_nodes"):
        HeteroGraphGenerator.Config(out="x", papers=100, train_nodes=90, test_nodes=20)
    with pytest.raises(ValueError, match="papers"):
        HeteroGraphGenerator.Config(out="x", papers=10, train_nodes=1)


def test_bench_hetero_smoke(tmp_path, capsys):
    d = tmp_path / "h"
    code = main(["bench", "gnn", "--hetero", "--papers", "2000", "--feat-dim", "16", "--train-nodes", "512",
                 "--test-nodes", "128", "--batch-size", "128", "--hidden", "8", "--fanouts", "4,2", "--epochs", "2",
                 "--presample-nodes", "128", "--holdout-nodes", "128", "--mmap-warmup-batches", "1",
                 "--mmap-batches", "2", "--mmap-threads", "1,3", "--load-probe-seconds", "0.3",
                 "--disk-probe-seconds", "0.3", "--dir", str(d), "--quiet", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    r = json.loads(out.out)
    ts, mem = r["terastack_epoch_seconds"], r["in_memory_pipelined_epoch_seconds"]
    assert len(ts) == len(mem) == 2
    assert r["slowdown_vs_in_memory_pipelined"] == pytest.approx(np.mean(ts) / np.mean(mem))
    mm = r["mmap"]
    assert mm["window"] == [1, 3] and r["mmap_run"]["batches"] == 3
    # one contender per thread count, the same batches; the headline is against the fastest
    windows = mm["window_seconds_by_threads"]
    assert set(windows) == set(r["mmap_runs"]) == {"1", "3"} and r["mmap_runs"]["3"]["batches"] == 3
    assert mm["window_seconds"] == min(windows.values()) == windows[str(mm["strongest_threads"])]
    assert r["speedup_vs_mmap"] == pytest.approx(mm["window_seconds"] / mm["terastack_window_seconds"])
    assert r["speedup_vs_mmap"] == pytest.approx(min(r["speedup_vs_mmap_by_threads"].values()))
    assert r["speedup_vs_mmap_by_threads"]["1"] == pytest.approx(windows["1"] / mm["terastack_window_seconds"])
    # the loader alone (no training step) over the same window, for terastack and every mmap contender
    loader = mm["loader_window_seconds"]
    assert set(r["loader_runs"]) == {"terastack", "mmap", "mmap_3_threads"}
    assert all(run["batches"] == 3 for run in r["loader_runs"].values())
    assert r["loader_speedup_vs_mmap"] == pytest.approx(min(loader.values()) / mm["terastack_loader_window_seconds"])
    assert set(r["peak_rss_bytes"]) == {"terastack", "in_memory_pipelined", "mmap", "mmap_3_threads"}
    assert r["tpc_error"] == pytest.approx(abs(r["tpc_predicted_epoch_seconds"] - np.mean(ts)) / np.mean(ts))
    assert r["tpc"]["topology_blocks_per_batch"] > 0  # the topology term is in the prediction
    # the model's SSD rate and step: measured while the other ran (the disk alone beside)
    loaded = r["tpc"]["ssd_while_training"]
    full = loaded["full_rate"]
    assert full["steps"] >= 5 and loaded["ssd_rand4k_iops"] == full["ssd_rand4k_iops"] > 0
    assert r["tpc"]["ssd"]["ssd_rand4k_iops"] > 0
    # the step: timed beside reads at the predicted epoch's rate, below the full rate (or at it, when the epoch
    # keeps the disk busy)
    assert all(0 <= k["rate_limit"] < full["ssd_rand4k_iops"] for k in loaded["at_epoch_rate"])
    assert loaded["compute_seconds_per_node"] == (loaded["at_epoch_rate"] or [full])[-1]["compute_seconds_per_node"]
    assert r["tpc"]["stages_seconds_per_batch"]["compute"] == pytest.approx(loaded["compute_seconds_per_batch"])
    assert r["loss_curves_identical"] is True  # every contender trains on the file's bytes
    assert r["accuracy"]["terastack"] == r["accuracy"]["in_memory_pipelined"]
    assert r["feature_to_budget_ratio"] == pytest.approx(4.0, rel=1e-3)
    assert r["train_nodes"] == 512 and r["terastack_epochs"][0]["batches"] == 4
    assert r["topology"]["topology"] == "ssd" and 0 <= r["hit_rates"]["topology"] <= 1
    assert all(v > 0 for v in r["peak_rss_bytes"].values())
    assert not d.exists()  # generated files are deleted at the end
