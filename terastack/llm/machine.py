"""The machine a trainer runs on: its device and compute dtype, its memory budgets, its measured speeds."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from terastack.dtypes import COMPUTE_DTYPES, to_dtype
from terastack.io.cuda import prefer_expandable_segments
from terastack.memory import mem_total


def resolve_device(device: str) -> torch.device:
    """``TrainerConfig.device`` as a torch device ("auto": the GPU when there is one), always with its index: a
    bare "cuda" means the current device of the thread that builds the trainer, and the trainer's background
    threads (whose current device is 0) must be told which."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    if device.startswith("cuda"):
        # before CUDA initialises (current_device below does): expandable segments unless the user configured the
        # allocator, so that what it reserves stays close to what the device ledger charges ([Note: the device
        # ledger and the caching allocator] in terastack.allocator)
        prefer_expandable_segments()
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def store_settings(plan, profile, device: torch.device) -> dict:
    """The TieredStore.Config fields a trainer's plan decides: the ledgers' sizes, the device (with its index),
    and the pinned staging cap ([Note: pinned staging] in terastack.io.cuda).

    The staging cap fits two of the largest compute-weight records in flight, within an eighth of the host
    budget; on an accelerator its chunks are host memory reserved in the host ledger, and the planner kept
    room for them inside the host budget (without one nothing is staged)."""
    from terastack.plan.staging import staging_cap

    largest = max(profile.tensor_numel.values(), default=0) * profile.compute_bytes
    cap = staging_cap(largest, plan.host_budget)
    host = plan.host_capacity - plan.grad_pool_bytes
    return {"device_budget": plan.device_capacity, "host_budget": host, "pinned_budget": cap,
            "device": str(device)}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``TrainerConfig.dtype`` as a torch dtype ("auto": bfloat16 on a GPU, float32 on a CPU)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return to_dtype(dtype, allowed=COMPUTE_DTYPES)


#: "auto" budgets: this share of the accelerator's free memory; without one, the device tier's fixed size (host
#: memory); a quarter of the host's memory, and at least the floor
DEVICE_SHARE, CPU_DEVICE_BUDGET, HOST_SHARE, HOST_FLOOR = 0.9, 1 << 30, 4, 256 << 20


def budgets(config, device: torch.device, hardware=None) -> tuple[int, int]:
    """(device, host) budgets in bytes of a ``TrainerConfig``, "auto" resolved on this machine -- or, given
    ``hardware`` (a machine planned for: ``terastack plan llm``), on its description, its GPU's memory taken as
    free."""
    device_budget, host_budget = config.device_budget, config.host_budget
    if device_budget == "auto":
        if device.type == "cuda" and hardware is not None:
            device_budget = int(hardware.gpu_memory_bytes * DEVICE_SHARE)
        elif device.type == "cuda":
            # blocks the allocator caches (calibration's, the skeleton's) count as used in mem_get_info
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info(device)
            device_budget = int(free * DEVICE_SHARE)
        else:
            device_budget = CPU_DEVICE_BUDGET
    if host_budget == "auto":
        memory = mem_total() if hardware is None else hardware.host_memory_bytes or mem_total()
        host_budget = max(HOST_FLOOR, memory // HOST_SHARE)
    return int(device_budget), int(host_budget)


def setup_budget(config, device: torch.device) -> tuple[str, int]:
    """(name, bytes): what set-up's working memory (timing the units: [Note: calibrating within the budget] in
    terastack.llm.engine.profile) is held within, before the store holds anything: the device budget, or without
    an accelerator and with one memory budget, what the tiers share of it."""
    from terastack.plan.budget_search import tier_memory

    if config.memory_budget is not None and device.type != "cuda":
        return "memory", tier_memory(int(config.memory_budget))
    return "device", budgets(config, device)[0]


def discover_hardware(config, device: torch.device):
    """The machine the plan is made for: ``config.hardware`` (a probe file), the cached probe, or quick
    measurements."""
    from terastack.plan.hardware import Hardware, load_probe

    if config.hardware:
        try:
            return Hardware.from_dict(json.loads(Path(config.hardware).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"hardware: cannot read probe file {config.hardware} ({exc})") from None
    hw = load_probe()
    if hw is not None:
        return hw
    from terastack.probe import measure_cpu_adam, measure_cpu_flops, measure_memcpy, measure_gpu

    # without the GPU's figures the planner would price every unit's compute at the CPU's speed
    gpu = measure_gpu() if device.type == "cuda" else {}
    if gpu:
        torch.cuda.empty_cache()  # the measurement's blocks are not the trainer's: the device budget may be "auto"
    return Hardware(name="this machine (quick measurements; run `terastack probe` for SSD figures)", measured=True,
                    **gpu,
                    cores=os.cpu_count() or 1, host_memory_bytes=mem_total(),
                    cpu_flops=0.0 if config.calibrate else measure_cpu_flops(0.1, 512),
                    memcpy_bytes_per_s=measure_memcpy(0.05, 16 << 20),
                    cpu_adam_params_per_s=measure_cpu_adam(0.1, 1 << 20), ssd_read_bytes_per_s=1e9,
                    ssd_write_bytes_per_s=1e9)


def make_plan(config, profile, hardware, device: torch.device, *, inline_updates: bool, name: str,
              accumulation: str | None = None, described: bool = False):
    """The planner and its plan for a ``TrainerConfig``'s budgets on this machine (``described``: on ``hardware``'s
    description, for ``terastack plan llm``); a single memory budget is split where the plan predicts the fastest
    step (terastack.plan.budget_search). ``accumulation``: the order to plan, in place of the configured one."""
    from terastack.llm.trainer_config import MEMORY_BUDGET_ENV
    from terastack.memory import return_freed_memory
    from terastack.plan.budget_search import plan_memory_budget
    from terastack.plan.llm_planner import LLMPlanner

    def plan_for(device_budget: int, host_budget: int):
        planner = LLMPlanner(config.planner_config(device_budget=device_budget, host_budget=host_budget,
                                                   inline_updates=inline_updates, accumulation=accumulation))
        return planner, planner.plan(profile, hardware)

    if config.memory_budget is None:
        return plan_for(*budgets(config, device, hardware if described else None))
    if device.type == "cuda":
        raise ValueError("memory_budget: only without an accelerator (give device_budget and host_budget)")
    if not described:
        return_freed_memory()  # [Note: a memory budget bounds resident memory] (terastack.memory)
    missing = [k for k in MEMORY_BUDGET_ENV if k not in os.environ]
    if missing and accumulation is None and not described:  # said once: planning a chosen order again asks the same
        warnings.warn("memory_budget: for a strict bound on resident memory start the process with "
                      + " ".join(f"{k}={v}" for k, v in MEMORY_BUDGET_ENV.items()), stacklevel=4)
    return plan_memory_budget(config.planner_config(device_budget=0, host_budget=0, inline_updates=inline_updates,
                                                    accumulation=accumulation),
                              config.memory_budget, profile, hardware, what=name)
