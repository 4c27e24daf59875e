"""Tiny generated datasets shared by the terastack.gnn tests (built once per session, in a temp dir)."""
from __future__ import annotations

import pytest

from terastack.gnn.gen import generate


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """3000 nodes, 16 fp32 features (64-byte rows: 64 rows per 4 KiB block), 4 classes."""
    out = tmp_path_factory.mktemp("gnn") / "tiny"
    generate(out, 3000, avg_degree=8, feat_dim=16, classes=4, train_fraction=0.2, val_fraction=0.05,
             test_fraction=0.1, progress=False, memory_budget="64MiB")
    return out


@pytest.fixture(scope="session")
def straddle(tmp_path_factory):
    """Rows of 400 bytes (100 fp32): rows straddle 4 KiB block boundaries."""
    out = tmp_path_factory.mktemp("gnn") / "straddle"
    generate(out, 2000, avg_degree=6, feat_dim=100, classes=3, progress=False, memory_budget="64MiB")
    return out


@pytest.fixture(scope="session")
def half(tmp_path_factory):
    """fp16 features, 24 per row (48 bytes)."""
    out = tmp_path_factory.mktemp("gnn") / "half"
    generate(out, 2500, avg_degree=6, feat_dim=24, classes=3, dtype="float16", progress=False, memory_budget="64MiB")
    return out


@pytest.fixture(scope="session")
def wide(tmp_path_factory):
    """Rows of 4400 bytes (1100 fp32): larger than a block."""
    out = tmp_path_factory.mktemp("gnn") / "wide"
    generate(out, 600, avg_degree=5, feat_dim=1100, classes=3, progress=False, memory_budget="64MiB")
    return out


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny shapes gain nothing from intra-op threads, and on a shared machine an OpenMP team whose second
    thread is descheduled stalls every op (measured: 10x slower steps), so these tests use one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
