"""Heterogeneous sampling: per-relation fanouts hold over edges that exist; batches with features and topology on the
SSD (one budget over every type's rows and every relation's lists) equal the batches with everything in memory;
PyG's to_hetero(GraphSAGE) and R-GCN consume them unchanged and, with every neighbour, give the seeds exactly
what they give on the whole graph in memory; the one-budget split is the greedy it claims to be."""
from __future__ import annotations

from terastack.gnn.storage.dataset import open_dataset

import numpy as np
import pytest
import torch

from terastack.gnn.graph_placement import Placement
from terastack.gnn.sampling.fanouts import parse_relation_fanouts as parse_hetero_fanouts
from terastack.gnn.sampling.pipeline import Pipeline
from terastack.gnn.sampling.sampler import NeighborSampler
from terastack.gnn.storage.budget_split import FeaturePart, ListPart, split_budget_parts
from terastack.gnn.storage.features import build_features
from terastack.gnn.settings import gnn_job
from terastack.gnn.training.train import GnnTrainer

FANOUTS = "cites=4,3;written_by=3,0;rev_written_by=2,2;*=2,1"


@pytest.fixture(scope="module")
def mem(hetero):
    return open_dataset(hetero)


def in_memory_features(ds):
    return build_features(ds, "memory")


def csc_neighbours(ds, et, v):
    topo = ds.topologies[et]
    return set(np.asarray(topo.indices[topo.indptr[v]:topo.indptr[v + 1]]).tolist())


@pytest.mark.parametrize("replace", [False, True])
def test_edges_exist_and_per_relation_fanouts_hold(mem, replace):
    sampler = NeighborSampler(dataset=mem, fanouts=FANOUTS, replace=replace, seed=2)
    assert sampler.fanouts[("paper", "cites", "paper")] == (4, 3)
    assert sampler.fanouts[("author", "affiliated_to", "institution")] == (2, 1)
    seeds = mem.splits["train"][:100]
    b = sampler.sample(seeds, np.random.default_rng(0))
    np.testing.assert_array_equal(b.n_id["paper"][:100], seeds)
    assert set(b.n_id) == set(mem.node_types) and set(b.row) == set(mem.edge_types)
    starts = {t: np.cumsum([0] + b.num_sampled_nodes[t]) for t in mem.node_types}
    for t, ids in b.n_id.items():
        assert len(np.unique(ids)) == len(ids) == starts[t][-1]
    for et in mem.edge_types:
        src, _, dst = et
        rows, cols = b.row[et], b.col[et]
        assert sum(b.num_sampled_edges[et]) == len(rows)
        for s, d in zip(b.n_id[src][rows].tolist(), b.n_id[dst][cols].tolist()):
            assert s in csc_neighbours(mem, et, d)
        e0 = 0
        for hop, fanout in enumerate(sampler.fanouts[et]):
            e1 = e0 + b.num_sampled_edges[et][hop]
            targets = np.arange(starts[dst][hop], starts[dst][hop + 1])  # first reached at the hop before
            got = np.bincount(cols[e0:e1] - starts[dst][hop], minlength=len(targets))
            assert len(got) == len(targets)
            topo = mem.topologies[et]
            deg = np.diff(np.asarray(topo.indptr))[b.n_id[dst][targets]]
            if fanout == 0:
                expected = np.zeros_like(deg)
            else:
                expected = np.where(deg > 0, fanout, 0) if replace else np.minimum(deg, fanout)
            np.testing.assert_array_equal(got, expected)
            e0 = e1


def test_fanouts_by_relation_are_checked(mem):
    ets = mem.edge_types
    assert parse_hetero_fanouts("5,3", ets) == {et: (5, 3) for et in ets}
    assert parse_hetero_fanouts({("paper", "cites", "paper"): [1], "*": [2]}, ets)[("paper", "cites", "paper")] == (1,)
    with pytest.raises(ValueError, match="same number of hops"):
        parse_hetero_fanouts("cites=4,3;*=2", ets)
    with pytest.raises(ValueError, match="no fanouts for relation"):
        parse_hetero_fanouts("cites=4,3", ets)
    with pytest.raises(ValueError, match="names no single relation"):
        parse_hetero_fanouts("wrote=4;*=1", ets)
    with pytest.raises(ValueError, match="positive integer, -1"):
        parse_hetero_fanouts("-2,3", ets)


def _batches(pipeline, ids, epochs=2):
    out = []
    for epoch in range(epochs):
        for data in pipeline.epoch(ids, 48, epoch=epoch):
            out.append({"x": {t: data[t].x.clone() for t in data.node_types},
                        "n_id": {t: data[t].n_id.clone() for t in data.node_types},
                        "edges": {et: data[et].edge_index.clone() for et in data.edge_types},
                        "y": data["paper"].y.clone(), "bs": data["paper"].batch_size})
    return out


@pytest.mark.parametrize("indptr,samplers", [("memory", 1), ("ssd", 1), ("ssd", 3)])
@pytest.mark.parametrize("replace", [False, True])
def test_ssd_batches_equal_in_memory_batches(hetero, mem, indptr, replace, samplers):
    """Topology and features on the SSD behind one budget: the same batches, bit for bit, as everything in memory
    (and in the same order with several sampler threads)."""
    ref_sampler = NeighborSampler(dataset=mem, fanouts=FANOUTS, replace=replace, seed=5)
    ref = Pipeline(ref_sampler, in_memory_features(mem), mem.target_labels)
    ssd = open_dataset(hetero, topology="ssd", indptr=indptr)
    train = ssd.splits["train"]
    fixed = 4 * (1200 + 900 + 150) + sum(t.memory_bytes for t in ssd.topologies.values())  # tables, indptr
    budget = fixed + (24 << 10)
    placed = Placement(ssd, fanouts=FANOUTS, replace=replace, seed=5, batch_size=48, host_cache=budget,
                       device_cache=2048, device="cpu", samplers=samplers)
    sampler, features, split = placed.sampler, placed.features, placed.split.info
    assert split["fixed_bytes"] == fixed
    try:
        got = placed.pipeline
        a, b = _batches(ref, train), _batches(got, train)
        assert len(a) == len(b) == 2 * -(-len(train) // 48)
        for x, y in zip(a, b):
            assert x["bs"] == y["bs"] and torch.equal(x["y"], y["y"])
            for t in mem.node_types:
                assert torch.equal(x["n_id"][t], y["n_id"][t]) and torch.equal(x["x"][t], y["x"][t]), t
            for et in mem.edge_types:
                assert torch.equal(x["edges"][et], y["edges"][et]), et
        # both caches were used and both missed: the equality covers hits, SSD reads, and their mix
        stats = sampler.topology.stats.snapshot()
        assert stats["hits"] > 0 and stats["misses"] > 0 and stats["indices_calls"] > 0
        gathered = features.stats.snapshot()
        assert gathered["host_hits"] + gathered["device_hits"] > 0 and gathered["misses"] > 0
        # one budget: every type's rows and every relation's lists within it
        spent = sum(split["list_bytes"].values()) + sum(split["feature_bytes"].values())
        assert 0 < sum(split["list_bytes"].values()) and 0 < sum(split["feature_bytes"].values())
        assert spent <= budget - fixed
        held = sum(c.host_rows * c.row_bytes for c in features.sources.values() if hasattr(c, "host_rows"))
        assert held <= budget - fixed - sum(split["list_bytes"].values())  # rows + lists within the one budget
    finally:
        placed.close()
        ssd.close()


def test_budget_split_is_one_greedy_over_every_part():
    """Against a plain-Python greedy: candidates of every part sorted by saved bytes per byte, taken while they fit."""
    rng = np.random.default_rng(0)
    deg = {"r1": rng.integers(0, 40, 300), "r2": rng.integers(0, 5, 200)}
    lists = {name: ListPart(rng.integers(0, 6, len(d)) * (rng.random(len(d)) < 0.5), lambda v, d=d: d[v], 4, 5,
                            name == "r2") for name, d in deg.items()}
    features = {"a": FeaturePart(rng.integers(0, 9, 250), 64, 4096), "b": FeaturePart(rng.integers(0, 3, 100), 400, 8192)}
    budget = 9000
    got = split_budget_parts(budget, lists=lists, features=features)
    cands = []
    for name, p in lists.items():
        for v in range(len(deg[name])):
            d = int(deg[name][v])
            if p.expansions[v] == 0 or (d == 0 and not p.indptr_on_ssd):
                continue
            blocks = 4096 * min(1 + max(d - 1, 0) * 4 / 4096, min(d, 5)) if d else 0.0
            saved = p.expansions[v] * (blocks + (4096 if p.indptr_on_ssd else 0))
            cands.append((saved / (d * 4 + 24), d * 4 + 24, ("list", name, v)))
    for name, p in features.items():
        for v in np.flatnonzero(p.counts).tolist():
            cands.append((p.counts[v] * p.read_bytes / p.row_bytes, p.row_bytes, ("features", name, v)))
    order = sorted(range(len(cands)), key=lambda i: -cands[i][0])  # stable, like the implementation's argsort
    spent, taken = 0, []
    for i in order:
        if spent + cands[i][1] > budget:
            break
        spent += cands[i][1]
        taken.append(cands[i][2])
    for name in lists:
        assert got.lists[name].tolist() == sorted(v for k, n, v in taken if k == "list" and n == name)
    for name, p in features.items():
        assert got.feature_bytes[name] == p.row_bytes * sum(1 for k, n, _ in taken if k == "features" and n == name)
    assert sum(got.list_bytes.values()) + sum(got.feature_bytes.values()) == spent


def _full_graph(ds):
    x = {t: torch.from_numpy(ds.read_type_features(t)).float() for t in ds.node_types}
    ei = {}
    for et, topo in ds.topologies.items():
        ip = np.asarray(topo.indptr)
        dst = np.repeat(np.arange(len(ip) - 1), np.diff(ip))
        ei[et] = torch.from_numpy(np.stack([np.asarray(topo.indices, np.int64), dst]))
    return x, ei


@pytest.mark.parametrize("kind", ["sage", "rgcn"])
def test_models_consume_batches_and_match_the_whole_graph(mem, kind):
    """With every neighbour (-1) over two hops the sampled batch holds each seed's whole 2-hop in-neighbourhood, so
    the model gives the seeds what it gives on the whole graph in memory. `to_hetero(GraphSAGE)` is built here as a
    user would build it; R-GCN is terastack's RGCNConv model."""
    from torch_geometric.nn import GraphSAGE, to_hetero

    from terastack.gnn.training.models import HeteroGNN

    torch.manual_seed(0)
    in_dims = {t: mem.feature_dims[t] or 1 for t in mem.node_types}
    if kind == "sage":
        model = to_hetero(GraphSAGE((-1, -1), 8, 2, out_channels=4), (mem.node_types, mem.edge_types), aggr="sum")

        def logits(x, ei):
            return model(x, ei)["paper"]
    else:
        net = HeteroGNN("rgcn", mem.node_types, mem.edge_types, in_dims, 8, 4, 2, "paper")

        def logits(x, ei):
            return net(x, ei)
    sampler = NeighborSampler(dataset=mem, fanouts="-1,-1")
    pipe = Pipeline(sampler, in_memory_features(mem), mem.target_labels, overlap=False)
    seeds = mem.splits["test"][:64]
    data = next(iter(pipe.epoch(seeds, 64, shuffle=False)))
    x, ei = _full_graph(mem)
    with torch.no_grad():
        full = logits(x, ei)[torch.from_numpy(seeds)]
        got = logits({t: v.float() for t, v in data.x_dict.items()}, data.edge_index_dict)[:64]
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)


def test_loss_curve_with_everything_on_the_ssd_equals_in_memory(hetero):
    common = dict(data=str(hetero), fanouts="3,2", batch_size=96, epochs=1, hidden=8, eval_nodes=64,
                  model="rgcn")
    a = GnnTrainer(gnn_job(**common, topology="memory", host_cache="8MiB"), progress=False).run()
    b = GnnTrainer(gnn_job(**common, topology="ssd", indptr="ssd", host_cache="48KiB"), progress=False).run()
    assert a["loss_curve"] == b["loss_curve"] and len(a["loss_curve"]) == 7
    assert a["val_acc"] == b["val_acc"] and a["test_acc"] == b["test_acc"]
    assert b["epochs"][0]["topology_ssd_bytes"] > 0 and b["epochs"][0]["miss_rate"] > 0
