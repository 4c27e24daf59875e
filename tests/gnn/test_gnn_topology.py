"""Topology on the SSD: the same batches and loss curve as topology in memory, one engine submission per hop,
one budget split between cached lists and feature rows, and files checked by name."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from terastack.constants import BLOCK
from terastack.gnn.storage.cache import UnifiedCache
from terastack.gnn.storage.dataset import DatasetError, open_dataset
from terastack.gnn.sampling.pipeline import Pipeline
from terastack.gnn.sampling.sampler import NeighborSampler, epoch_batches
from terastack.gnn.storage.topology import DiskArray
from terastack.gnn.storage.budget_split import FeaturePart, ListPart, list_read_bytes, split_budget_parts
from terastack.gnn.settings import gnn_job
from terastack.gnn.training.train import GnnTrainer
from terastack.io import IOEngine
from terastack.io.backend import backend_unavailable_reason


def _batches(sampler, ids, batch_size=64, epochs=2):
    out = []
    for epoch in range(epochs):
        for k, seeds in enumerate(epoch_batches(ids, batch_size, seed=0, epoch=epoch)):
            out.append(sampler.sample(seeds, sampler.batch_rng(epoch, k)))
    return out


def test_disk_array_reads_equal_numpy(tiny):
    ref = np.fromfile(tiny / "indices.bin", dtype=np.int32)
    arr = DiskArray(tiny / "indices.bin", np.int32, len(ref))
    try:
        rng = np.random.default_rng(0)
        pos = rng.integers(0, len(ref), 5000)
        values, nbytes, blocks = arr.take(pos)
        assert np.array_equal(values, ref[pos])
        assert blocks == len(np.unique(pos * 4 // BLOCK))  # the covering blocks, each read once
        assert (blocks - 1) * BLOCK < nbytes <= blocks * BLOCK  # the file's last block may be partial
        assert np.array_equal(arr[100:5000], ref[100:5000]) and arr[-1] == ref[-1] and arr[7] == ref[7]
        assert np.array_equal(np.asarray(arr), ref)
    finally:
        arr.close()


@pytest.mark.parametrize("indptr", ["memory", "ssd"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("cached", [0, 400])
def test_ssd_sampler_batches_equal_in_memory(tiny, indptr, replace, cached):
    mem = open_dataset(tiny)
    ssd = open_dataset(tiny, topology="ssd", indptr=indptr)
    try:
        if cached:  # some lists from the cache, the rest from the SSD, in the same hop
            ssd.topology.fill(np.random.default_rng(1).choice(ssd.num_nodes, cached, replace=False))
        ref = NeighborSampler(mem.indptr, mem.indices, fanouts=(6, 4), replace=replace, seed=3)
        got = NeighborSampler(topology=ssd.topology, fanouts=(6, 4), replace=replace, seed=3)
        for a, b in zip(_batches(ref, mem.splits["train"]), _batches(got, mem.splits["train"]), strict=True):
            assert np.array_equal(a.n_id, b.n_id) and np.array_equal(a.row, b.row) and np.array_equal(a.col, b.col)
        stats = ssd.topology.stats.snapshot()
        assert stats["indices_calls"] > 0 and (stats["hits"] > 0) == bool(cached)
    finally:
        ssd.close()


@pytest.mark.skipif(backend_unavailable_reason("threads") is not None,
                    reason=f"needs the native I/O core: {backend_unavailable_reason('threads')}")
@pytest.mark.parametrize("indptr,per_hop", [("memory", 1), ("ssd", 2)])
def test_engine_submissions_per_batch(tiny, indptr, per_hop):
    """Counted by the storage engine itself: one submission per hop for the lists (plus one for indptr entries
    when indptr is on the SSD), and one per batch for the feature misses."""
    with IOEngine(backend="threads") as engine:
        ds = open_dataset(tiny, topology="ssd", indptr=indptr, verify="size", engine=engine)
        sampler = NeighborSampler(topology=ds.topology, fanouts=(5, 3), seed=2)
        ids = ds.splits["train"]
        for k, seeds in enumerate(epoch_batches(ids, 50, seed=2, epoch=0)[:5]):
            before = engine.stats.snapshot()["batches"]
            sampler.sample(seeds, sampler.batch_rng(0, k))
            assert engine.stats.snapshot()["batches"] - before == per_hop * sampler.hops
        with UnifiedCache(ds, np.arange(ds.num_nodes), host_budget=0, engine=engine) as cache:
            pipe = Pipeline(sampler, cache, ds.labels, overlap=True)
            before = engine.stats.snapshot()["batches"]
            batches = sum(1 for _ in pipe.epoch(ids, 50, epoch=1))
            assert engine.stats.snapshot()["batches"] - before == batches * (per_hop * 2 + 1)
        ds.close()


def _train(root, topology, host_cache, **kw):
    cfg = gnn_job(data=str(root), fanouts=(5, 3), batch_size=64, epochs=2, hidden=16, host_cache=host_cache,
                  topology=topology, eval_nodes=200, seed=5, device="cpu", **kw)
    return GnnTrainer(cfg, progress=False).run()


def test_training_with_topology_on_ssd_gives_the_same_loss_curve(tiny):
    budget = tiny_budget = 3000 * 4 + 40_000
    mem = _train(tiny, "memory", budget)
    ssd = _train(tiny, "ssd", tiny_budget, indptr="ssd")
    assert len(mem["loss_curve"]) > 10
    assert ssd["loss_curve"] == mem["loss_curve"]  # same batches, bit-identical features: the very same curve
    assert ssd["test_acc"] == mem["test_acc"]
    topo = ssd["topology"]
    assert topo["topology"] == "ssd" and topo["indptr"] == "ssd"
    e = ssd["epochs"][0]
    assert e["topology_ssd_bytes"] > 0 and 0 < e["topology_hit_rate"] < 1


def test_one_budget_is_split_between_lists_and_rows_on_a_power_law_graph(tiny):
    ds = open_dataset(tiny)
    budget = ds.num_nodes * 4 + 60_000
    r = _train(tiny, "ssd", budget)
    split = r["topology"]["split"]
    assert sum(split["list_bytes"].values()) > 0 and sum(split["feature_bytes"].values()) > 0
    assert r["topology"]["memory_bytes"] + r["cache"]["host_bytes"] + r["cache"]["table_bytes"] <= budget
    e = r["epochs"][0]
    assert 0 < e["topology_hit_rate"] < 1
    assert 0 < e["host_hit_rate"] < 1 and e["miss_rate"] > 0
    # the measured list hit rate is the share of expansions of the cached lists in this epoch's batches
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 3), seed=5)
    cached = np.zeros(ds.num_nodes, bool)
    assert r["topology"]["cached_lists"] == sum(split["lists"].values())
    from terastack.gnn.graph_placement import Placement

    with Placement(tiny, fanouts=(5, 3), seed=5, batch_size=64, topology="ssd", host_cache=budget, device="cpu") as p:
        cached[p.dataset.topology.hot.ids] = True  # the lists the trainer's placement call cached
    lookups = hits = 0
    for k, seeds in enumerate(epoch_batches(ds.splits["train"], 64, seed=5, epoch=0)):
        b = sampler.sample(seeds, sampler.batch_rng(0, k))
        expanded = b.n_id[: b.num_nodes - b.num_sampled_nodes[-1]]
        lookups += len(expanded)
        hits += int(cached[expanded].sum())
    assert e["topology_hit_rate"] == pytest.approx(hits / lookups)


def test_split_budget_follows_saved_bytes_per_byte():
    """Against a plain-Python greedy over the Note's formulas."""
    rng = np.random.default_rng(0)
    n, row_bytes, fanout = 300, 512, 10
    counts = rng.zipf(1.6, n).clip(0, 500) * (rng.random(n) < 0.7)
    expansions = (counts * rng.random(n)).astype(np.int64)
    deg = rng.zipf(1.5, n).clip(0, 5000) - 1  # some lists empty
    budget = 40_000
    split = split_budget_parts(budget, lists={"": ListPart(expansions, lambda v: deg[v], 4, fanout, True)},
                               features={"": FeaturePart(counts, row_bytes, BLOCK)})
    items = []
    for v in range(n):
        if counts[v] > 0:
            items.append((counts[v] * BLOCK / row_bytes, row_bytes, "f", v))
        if expansions[v] > 0:  # indptr on the SSD: even an empty list saves its indptr read
            blocks = min(1 + (deg[v] - 1) * 4 / BLOCK, min(deg[v], fanout))
            items.append((expansions[v] * (BLOCK * blocks + BLOCK) / (deg[v] * 4 + 24), deg[v] * 4 + 24, "t", v))
    items.sort(key=lambda t: -t[0])
    used, lists = 0, []
    for density, cost, kind, v in items:
        if used + cost > budget:
            break
        used += cost
        if kind == "t":
            lists.append(v)
    assert sorted(lists) == split.lists[""].tolist() and len(lists) > 0
    assert (deg[split.lists[""]] == 0).any()  # cheap and worth one indptr read each
    assert split.list_bytes[""] == sum(deg[v] * 4 + 24 for v in lists)
    assert split.feature_bytes[""] <= budget - split.list_bytes[""]
    assert list_read_bytes(np.array([0]), 4, fanout)[0] == 0


def test_truncated_indices_file_is_refused_by_name(tiny, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    path = bad / "indices.bin"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 4)
    with pytest.raises(DatasetError, match=r"indices\.bin.*truncated"):
        open_dataset(bad, topology="ssd", verify="size")
    with pytest.raises(ValueError, match=r"indices\.bin.*truncated"):
        DiskArray(path, np.int32, (path.stat().st_size + 4) // 4)


def test_ssd_topology_config_is_checked(tiny):
    with pytest.raises(ValueError, match="indptr"):
        open_dataset(tiny, topology="ssd", indptr="ram")
    with pytest.raises(ValueError, match="topology"):
        open_dataset(tiny, topology="disk")
    with pytest.raises(ValueError, match="host_cache"):  # indptr in memory is paid from the budget
        _train(tiny, "ssd", 1000, indptr="memory")


def test_fill_in_bounded_groups_caches_every_list_exactly(tiny):
    mem = open_dataset(tiny)
    ssd = open_dataset(tiny, topology="ssd", indptr="ssd")
    try:
        nodes = np.random.default_rng(4).choice(ssd.num_nodes, 700, replace=False)
        ssd.topology.fill(nodes, step_entries=37)  # many groups, some lists longer than a group
        hot = ssd.topology.hot
        assert np.array_equal(hot.ids, np.sort(nodes))
        for k, v in enumerate(hot.ids.tolist()):
            assert np.array_equal(hot.lists[hot.ptr[k]:hot.ptr[k + 1]], mem.indices[mem.indptr[v]:mem.indptr[v + 1]])
            assert hot.start[k] == mem.indptr[v]
    finally:
        ssd.close()
