"""Tiny generated datasets shared by the terastack.gnn tests (built once per session, in a temp dir)."""
from __future__ import annotations

import numpy as np
import pytest

from terastack.gnn.storage.gen import generate


def _reference_csc(src: np.ndarray, dst: np.ndarray, n: int, drop_self_loops: bool):
    """CSC from an edge list with plain numpy: sorted by (dst, src), duplicates merged."""
    pairs = np.unique(np.stack([dst, src], axis=1), axis=0)
    if drop_self_loops:
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(pairs[:, 0], minlength=n))])
    return indptr, pairs[:, 1]


@pytest.fixture(scope="session")
def reference_csc():
    return _reference_csc


def _make(factory, name: str, nodes: int, **kwargs):
    out = factory.mktemp("gnn") / name
    generate(out, nodes, progress=False, memory_budget="64MiB", **kwargs)
    return out


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """3000 nodes, 16 fp32 features (64-byte rows: 64 rows per 4 KiB block), 4 classes."""
    return _make(tmp_path_factory, "tiny", 3000, avg_degree=8, feat_dim=16, classes=4, train_fraction=0.2,
                 val_fraction=0.05, test_fraction=0.1)


@pytest.fixture(scope="session")
def straddle(tmp_path_factory):
    """Rows of 400 bytes (100 fp32): rows straddle 4 KiB block boundaries."""
    return _make(tmp_path_factory, "straddle", 2000, avg_degree=6, feat_dim=100, classes=3)


@pytest.fixture(scope="session")
def half(tmp_path_factory):
    """fp16 features, 24 per row (48 bytes)."""
    return _make(tmp_path_factory, "half", 2500, avg_degree=6, feat_dim=24, classes=3, dtype="float16")


@pytest.fixture(scope="session")
def wide(tmp_path_factory):
    """Rows of 4400 bytes (1100 fp32): larger than a block."""
    return _make(tmp_path_factory, "wide", 600, avg_degree=5, feat_dim=1100, classes=3)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny shapes gain nothing from intra-op threads, and on a shared machine an OpenMP team whose second
    thread is descheduled stalls every op (measured: 10x slower steps), so these tests use one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_hetero(out, *, papers=1200, authors=900, institutions=60, fos=150, seed=0, undirected=True):
    """An IGBH-shaped heterogeneous dataset written through ``from_pyg(HeteroData)``: paper (16 fp32 features,
    labelled, 4 classes that the features and the cited papers' classes predict), author (8 fp16 features),
    institution (no features), fos (12 fp32); written_by, cites, affiliated_to, topic (+ reverse edges)."""
    import torch
    from torch_geometric.data import HeteroData

    from terastack.gnn import from_pyg

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, papers)
    centroids = rng.standard_normal((4, 16)) * 1.5
    data = HeteroData()
    data["paper"].x = torch.from_numpy((centroids[labels] + rng.standard_normal((papers, 16))).astype(np.float32))
    data["paper"].y = torch.from_numpy(labels)
    data["author"].x = torch.from_numpy(rng.standard_normal((authors, 8)).astype(np.float16))
    data["institution"].num_nodes = institutions
    data["fos"].x = torch.from_numpy(rng.standard_normal((fos, 12)).astype(np.float32))
    # power-law-ish endpoints so some lists are long and some nodes hot
    def ends(n, e):
        return np.minimum((rng.pareto(1.2, e) * n / 20).astype(np.int64), n - 1)
    cites_dst = rng.integers(0, papers, 6 * papers)
    same = rng.random(len(cites_dst)) < 0.7  # most citations stay within a class
    by_class = np.argsort(labels, kind="stable")
    size = np.bincount(labels, minlength=4)
    c = labels[cites_dst]
    same_class = by_class[size.cumsum()[c] - size[c] + (rng.random(len(c)) * size[c]).astype(np.int64)]
    cites_src = np.where(same, same_class, ends(papers, len(cites_dst)))
    data["paper", "cites", "paper"].edge_index = torch.from_numpy(np.stack([cites_src, cites_dst]))
    data["paper", "written_by", "author"].edge_index = torch.from_numpy(
        np.stack([rng.integers(0, papers, 3 * papers), ends(authors, 3 * papers)]))
    data["author", "affiliated_to", "institution"].edge_index = torch.from_numpy(
        np.stack([rng.integers(0, authors, authors), ends(institutions, authors)]))
    data["paper", "topic", "fos"].edge_index = torch.from_numpy(
        np.stack([rng.integers(0, papers, 2 * papers), ends(fos, 2 * papers)]))
    perm = rng.permutation(papers)
    data["paper"].train_idx = torch.from_numpy(perm[: papers // 2])
    data["paper"].val_idx = torch.from_numpy(perm[papers // 2: 3 * papers // 4])
    data["paper"].test_idx = torch.from_numpy(perm[3 * papers // 4:])
    from_pyg(data, out, undirected=undirected)
    return out


@pytest.fixture(scope="session")
def hetero(tmp_path_factory):
    """The IGBH-shaped heterogeneous dataset of :func:`make_hetero`."""
    return make_hetero(tmp_path_factory.mktemp("gnn") / "hetero")
