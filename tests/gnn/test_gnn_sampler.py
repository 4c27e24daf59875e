"""The vectorized neighbour sampler: edges exist, fanouts hold, uniform, deterministic, PyG-compatible."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.sampler import NeighborSampler, epoch_batches, parse_fanouts


@pytest.fixture(scope="module")
def ds(tiny):
    return open_dataset(tiny)


def neighbours(ds, v: int) -> np.ndarray:
    return ds.indices[ds.indptr[v]:ds.indptr[v + 1]]


@pytest.mark.parametrize("replace", [False, True])
def test_sampled_edges_exist_and_fanouts_hold(ds, replace):
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(4, 3), replace=replace)
    seeds = ds.splits["train"][:200]
    b = sampler.sample(seeds, np.random.default_rng(0))
    np.testing.assert_array_equal(b.n_id[:200], seeds)
    assert len(np.unique(b.n_id)) == len(b.n_id)
    assert sum(b.num_sampled_nodes) == len(b.n_id) and sum(b.num_sampled_edges) == len(b.row)
    src, dst = b.n_id[b.row], b.n_id[b.col]
    for s, d in zip(src.tolist(), dst.tolist()):
        assert s in set(neighbours(ds, d).tolist())
    # per hop: targets are the previous hop's new nodes, each gets min(deg, fanout) (or fanout with replacement)
    hop_start = np.cumsum([0] + b.num_sampled_nodes)
    edge_start = np.cumsum([0] + b.num_sampled_edges)
    for hop, fanout in enumerate((4, 3)):
        cols = b.col[edge_start[hop]:edge_start[hop + 1]]
        rows = b.row[edge_start[hop]:edge_start[hop + 1]]
        targets = np.arange(hop_start[hop], hop_start[hop + 1])
        assert set(cols.tolist()) <= set(targets.tolist())
        counts = np.bincount(cols - hop_start[hop], minlength=len(targets))
        deg = np.diff(ds.indptr)[b.n_id[targets]]
        expected = np.where(deg > 0, fanout, 0) if replace else np.minimum(deg, fanout)
        np.testing.assert_array_equal(counts, expected)
        if not replace:  # distinct neighbours per target
            pairs = rows.astype(np.int64) * len(b.n_id) + cols
            assert len(np.unique(pairs)) == len(pairs)


def test_deterministic_by_seed(ds):
    s = NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 5), seed=3)
    seeds = ds.splits["train"][:64]
    a, b = s.sample(seeds, s.batch_rng(0, 1)), s.sample(seeds, s.batch_rng(0, 1))
    c = s.sample(seeds, s.batch_rng(0, 2))
    np.testing.assert_array_equal(a.n_id, b.n_id)
    np.testing.assert_array_equal(a.row, b.row)
    np.testing.assert_array_equal(a.col, b.col)
    assert len(a.n_id) != len(c.n_id) or not np.array_equal(a.n_id, c.n_id)
    e1 = epoch_batches(ds.splits["train"], 50, seed=3, epoch=0)
    e2 = epoch_batches(ds.splits["train"], 50, seed=3, epoch=0)
    assert all(np.array_equal(x, y) for x, y in zip(e1, e2))


def test_without_replacement_is_uniform():
    # one target with 12 neighbours, fanout 4: every neighbour chosen with probability 1/3
    indptr = np.array([0, 12] + [12] * 12, np.int64)
    indices = np.arange(1, 13, dtype=np.int32)
    s = NeighborSampler(indptr, indices, fanouts=(4,))
    rng = np.random.default_rng(0)
    counts = np.zeros(13)
    trials = 6000
    for _ in range(trials):
        b = s.sample([0], rng)
        counts[b.n_id[1:]] += 1
    freq = counts[1:] / trials
    assert np.allclose(freq, 1 / 3, atol=0.03), freq


@pytest.mark.parametrize("bad", ["0,5", "-2", "a,b", "", "5,,5"])
def test_fanouts_must_be_positive(bad):
    with pytest.raises(ValueError, match="fanouts"):
        parse_fanouts(bad)
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(np.zeros(2, np.int64), np.zeros(0, np.int64), fanouts=bad)


def test_bad_seeds(ds):
    s = NeighborSampler(ds.indptr, ds.indices, fanouts=(2,))
    with pytest.raises(ValueError, match="out of range"):
        s.sample([ds.num_nodes], np.random.default_rng(0))
    with pytest.raises(ValueError, match="distinct"):
        s.sample([1, 1], np.random.default_rng(0))
    # the failed calls left no stale local ids behind
    b = s.sample([5], np.random.default_rng(0))
    assert b.n_id[0] == 5


def test_one_hop_batches_match_full_graph_pyg_layers(ds):
    """With fanout >= max degree, a 1-hop batch holds each seed's whole neighbourhood: SAGEConv and GATConv
    give the seeds exactly what they give on the whole graph in memory."""
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    x = torch.from_numpy(ds.read_features())
    deg = np.diff(ds.indptr)
    full_ei = torch.from_numpy(np.stack([ds.indices.astype(np.int64), np.repeat(np.arange(ds.num_nodes), deg)]))
    s = NeighborSampler(ds.indptr, ds.indices, fanouts=(int(deg.max()),))
    seeds = ds.splits["train"][:128]
    b = s.sample(seeds, np.random.default_rng(0))
    data = b.to_data(x[torch.from_numpy(b.n_id)])
    torch.manual_seed(0)
    for layer in (SAGEConv(16, 8), GATConv(16, 8, heads=2)):
        full = layer(x, full_ei)[torch.from_numpy(seeds)]
        sampled = layer(data.x, data.edge_index)[: data.batch_size]
        torch.testing.assert_close(sampled, full, rtol=1e-5, atol=1e-5)
    out = GCNConv(16, 8)(data.x, data.edge_index)  # consumed unchanged (its normalisation is per subgraph)
    assert out.shape == (len(b.n_id), 8) and torch.isfinite(out).all()
