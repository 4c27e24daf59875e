"""Fixtures of the LLM engine tests (helpers live in llm_helpers.py)."""
import json

import pytest

from .llm_helpers import BATCH, SEQ
from terastack.plan.hardware import Hardware


@pytest.fixture
def hardware_file(tmp_path):
    """A fixed machine description, so tests neither probe nor depend on timing."""
    hw = Hardware(name="test machine", measured=True, cores=2, host_memory_bytes=8 << 30, cpu_flops=2e10,
                  memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=1e9, ssd_write_bytes_per_s=8e8,
                  cpu_adam_params_per_s=2e8)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(hw.to_dict()))
    return str(path)


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
