import os

import pytest

# Tests never read a probe cached by the user's own runs.
os.environ.setdefault("TERASTACK_CACHE", os.path.join(os.path.dirname(__file__), ".cache-never-written"))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA; the CPU path is what CI runs")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TERASTACK_CACHE", str(tmp_path / "cache"))
