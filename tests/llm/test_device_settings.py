"""What a trainer tells its store about the device, without a GPU: the device index kept (background threads
resolve a bare "cuda" to device 0), the pinned staging cap sized from the plan and counted in the host ledger."""
from types import SimpleNamespace

import torch

from .llm_helpers import make_model
from terastack.llm import Trainer
from terastack.llm import machine
from terastack.plan.staging import staging_cap


def _fake_cuda(monkeypatch, current: int):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


def test_device_index_is_kept(monkeypatch):
    _fake_cuda(monkeypatch, current=1)
    assert machine.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert machine.resolve_device("cuda") == torch.device("cuda", 1)  # the current device, by its index
    assert machine.resolve_device("auto") == torch.device("cuda", 1)
    assert machine.resolve_device("cpu") == torch.device("cpu")


def _plan_and_profile():
    plan = SimpleNamespace(device_capacity=3 << 30, host_capacity=10 << 30, grad_pool_bytes=1 << 30,
                           host_budget=12 << 30)
    # a Llama-3 embedding: 128256 x 4096 in bf16, about 1 GB (four times the old fixed 256 MiB cap)
    profile = SimpleNamespace(tensor_numel={"embed": 128256 * 4096, "q": 4096 * 4096}, compute_bytes=2)
    return plan, profile


def test_store_settings_pass_the_device_index_and_size_staging_from_the_plan():
    plan, profile = _plan_and_profile()
    got = machine.store_settings(plan, profile, torch.device("cuda", 1))
    cap = staging_cap(128256 * 4096 * 2, 12 << 30)
    assert got["device"] == "cuda:1"
    assert got["pinned_budget"] == cap and cap > 256 << 20
    # pinned pages are host memory, reserved by the planner inside the host budget: the ledger is the plan's
    assert got["host_budget"] == (10 << 30) - (1 << 30)
    assert got["device_budget"] == 3 << 30


def test_store_settings_without_an_accelerator_keep_the_plans_host_ledger():
    plan, profile = _plan_and_profile()
    got = machine.store_settings(plan, profile, torch.device("cpu"))
    assert got["device"] == "cpu" and got["host_budget"] == 9 << 30


def test_trainer_sizes_its_stores_staging_from_its_plan(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        largest = max(t.profile.tensor_numel.values()) * t.profile.compute_bytes
        assert t.store.config.pinned_budget == staging_cap(largest, t.plan.host_budget)
        assert t.store.config.device == "cpu"
        assert t.store.pinned.ledger.name == "host"


def test_quick_hardware_on_a_gpu_has_the_gpus_figures(monkeypatch):
    """Without a probe file the planner must still know it plans for a GPU (else it prices compute on the CPU)."""
    from terastack import probe

    monkeypatch.setattr(probe, "measure_gpu", lambda: {"gpu_name": "fake", "gpu_memory_bytes": 1 << 34,
                                                      "gpu_flops": 1e14, "pcie_bytes_per_s": 2e10})
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    config = SimpleNamespace(hardware=None, calibrate=True)
    hw = machine.discover_hardware(config, torch.device("cuda", 0))
    assert hw.has_gpu and hw.gpu_flops == 1e14 and hw.pcie_bytes_per_s == 2e10
    assert not machine.discover_hardware(config, torch.device("cpu")).has_gpu
