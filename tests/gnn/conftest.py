"""Tiny generated datasets shared by the terastack.gnn tests (built once per session, in a temp dir)."""
from __future__ import annotations

import numpy as np
import pytest

from terastack.gnn.gen import generate


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
