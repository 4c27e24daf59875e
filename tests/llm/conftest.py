"""Fixtures of the LLM engine tests (helpers live in llm_helpers.py)."""
import pytest

from .llm_helpers import BATCH, SEQ
from ..described_machine import write_machine


@pytest.fixture
def hardware_file(tmp_path):
    """A fixed machine description, so tests neither probe nor depend on timing."""
    return write_machine(tmp_path / "hw.json")


@pytest.fixture
def trainer_config(tmp_path, hardware_file):
    from terastack.llm import TrainerConfig

    def make(**kw):
        kw.setdefault("store_dir", str(tmp_path / "store"))
        kw.setdefault("device_budget", "64MiB")
        kw.setdefault("host_budget", "64MiB")
        kw.setdefault("lr", 1e-3)
        kw.setdefault("weight_decay", 0.01)
        kw.setdefault("batch_size", BATCH)
        kw.setdefault("seq_len", SEQ)
        kw.setdefault("calibrate", False)
        kw.setdefault("hardware", hardware_file)
        kw.setdefault("optimizer_impl", "single")  # torch.optim.AdamW's default on CPU tensors
        return TrainerConfig(**kw)
    return make


@pytest.fixture(params=["one", "two"])
def store_dirs(request, tmp_path):
    """``TrainerConfig.store_dir``: one directory, or two (the store spanning two SSDs)."""
    if request.param == "one":
        return str(tmp_path / "store")
    return f"{tmp_path / 'ssd0'},{tmp_path / 'ssd1'}"
