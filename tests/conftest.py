import os

import pytest

# Tests never read a probe cached by the user's own runs.
os.environ.setdefault("TERASTACK_CACHE", os.path.join(os.path.dirname(__file__), ".cache-never-written"))
# [Note: one intra-op thread]
# The tests' shapes are tiny: an op gains nothing from a second OpenMP thread, and on a machine whose cores are
# busy an OpenMP team waits for its descheduled member at every op (a budget-contract case: 2-3x slower with two
# threads on a loaded 2-core machine; tests/gnn measured 10x for its steps). Set before torch is imported, so
# that every process the tests start (ranks, benchmark scripts, the CLI) runs one thread too; a test or a
# command that sets its own count (dist's --threads, gnn's threads) still does.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# bitsandbytes wraps its CPU quantize / dequantize in torch.compile(dynamic=False): the first call of each tensor
# shape in a process builds C++ through inductor (2 s with a warm /tmp/torchinductor cache, 42-67 s on a fresh
# machine in one test). Its functions run the same operations eagerly when dynamo is off, which is what the tests
# compare terastack's NF4 and 8-bit state against; terastack itself compiles nothing.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


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


@pytest.fixture
def cached_probe(_isolated_cache):
    """The test's probe cache holds ``TEST_MACHINE`` (tests/described_machine.py): a command that takes the cached
    probe or measures one (``terastack.probe.load_or_measure``) takes it, as a user's second run takes the first
    run's, instead of probing this machine for seconds; test_probe.py covers the measuring and the caching."""
    from .described_machine import write_machine

    return write_machine(os.path.join(os.environ["TERASTACK_CACHE"], "probe.json"))
