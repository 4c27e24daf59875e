"""``terastack plan llm``: will this model fine-tune on this (or that) machine, how, and how fast?

The model is profiled on the meta device (no weights, any size), the hardware is this machine's probe or a
described one, and the planner answers with a placement, a predicted step time and tokens/s and the
bottleneck -- or the budget that is short and by how much, or that the disk cannot hold the state it puts there.
With ``--largest``, the largest built-in model each optimizer format fully fine-tunes on the machine, and whether a
70B LoRA over an NF4 base fits (:mod:`terastack.llm.plan_largest`). Predictions for hardware that was not
measured are labelled as such. Exit status: 0 with a plan, 3 when the job does not fit (:data:`NO_FIT`), 2 on an
error.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys

from terastack.units import format_bytes, parse_bytes

GB = 1e9


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a built-in name (e.g. opt-175b, llama-2-7b), a config.json or "
                                                 "a Hugging Face model directory (required unless --largest)")
    p.add_argument("--largest", action="store_true",
                   help="instead of one model: the largest built-in model each optimizer format fully fine-tunes "
                        "on the machine, with its bytes per parameter per step, and a 70B LoRA over an NF4 base")
    p.add_argument("--seq-len", type=int, default=1024,
                   help="tokens per row of a micro-batch: with --batch-size, what the activations and the predicted "
                        "step are sized for (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="rows per micro-batch, each of --seq-len tokens (default %(default)s)")
    p.add_argument("--hardware", default=None, help="a preset (rtx4090-workstation, a100-server, h200) or a probe "
                                                    "JSON file; default: this machine's probe (run if not cached)")
    p.add_argument("--gpu-mem", default=None, help="accelerator memory, e.g. 24GB (a hypothetical GPU)")
    p.add_argument("--gpu-tflops", type=float, default=None, help="accelerator matmul rate in TFLOP/s")
    p.add_argument("--pcie-bw", type=float, default=None, help="host<->device GB/s each way (default 25 with a GPU)")
    p.add_argument("--host-mem", default=None, help="host memory, e.g. 256GB")
    p.add_argument("--ssd-bw", default=None, metavar="R/W", help="per-SSD read/write GB/s, e.g. 6.8/4.5")
    p.add_argument("--ssds", type=int, default=None, help="number of SSDs striped together")
    p.add_argument("--disk", default=None, help="disk space the store may take, e.g. 4TB (default: the preset's, or "
                                                "the free space the probe saw)")
    p.add_argument("--cpu-adam", type=float, default=None, metavar="MPARAMS", help="CPU AdamW rate, M params/s")
    p.add_argument("--device-budget", default=None, help="default: 90%% of the GPU (without one: a quarter of RAM)")
    p.add_argument("--host-budget", default=None, help="default: 80%% of host memory (half without a GPU)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="compute dtype (default: bfloat16 with a GPU, float32 without)")
    p.add_argument("--policy", default="auto", help="activation policy: auto, keep, host, ssd or recompute")
    p.add_argument("--clip", action="store_true", help="plan for global-norm clipping (deferred updates)")
    p.add_argument("--lora", type=int, default=None, metavar="R", help="plan a LoRA fine-tune of rank R")
    from terastack.plan.base_formats import PLANNED_BASE_FORMATS

    p.add_argument("--base-format", default="native", choices=PLANNED_BASE_FORMATS,
                   help="with --lora: the frozen base resting and streaming as NF4 (bitsandbytes' 4 bits, about "
                        "0.56 bytes a parameter) or in the compute dtype (default native)")
    from terastack.plan.optimizer_names import OPTIMIZER_NAMES

    p.add_argument("--optimizer", default=OPTIMIZER_NAMES[0], choices=OPTIMIZER_NAMES,
                   help="the optimizer state format, as --optimizer of terastack finetune (default adamw)")
    from terastack.training.job.engine_sections import DEFAULT_VOCAB_SLICE

    p.add_argument("--vocab-slice", default=DEFAULT_VOCAB_SLICE, metavar="BYTES",
                   help="as --vocab-slice of terastack finetune: an embedding or head larger than this streams in "
                        f"row slices of at most this size (default {DEFAULT_VOCAB_SLICE}; 0: never)")
    p.add_argument("--calibrate", action="store_true",
                   help="time each distinct unit on this machine instead of using FLOP rates (the times are kept "
                        "beside the machine's probe: the same question gets the same answer)")
    p.add_argument("--recalibrate", action="store_true", help="like --calibrate, but time the units again")
    p.add_argument("--json", action="store_true", help="print the plan (or what is short) as JSON")


def resolve_hardware(args):
    """The machine to plan for: a preset, a probe file, or this machine's probe; flags override (hypothetical)."""
    from pathlib import Path

    from terastack.plan.hardware import PRESETS, Hardware

    if args.hardware in PRESETS:
        hw = PRESETS[args.hardware]
    elif args.hardware:
        try:
            hw = Hardware.from_dict(json.loads(Path(args.hardware).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"--hardware: {args.hardware!r} is neither a preset ({', '.join(PRESETS)}) nor a "
                             f"readable probe file ({exc})") from None
    else:
        from terastack.probe import load_or_measure

        hw = load_or_measure()
    changes = {}
    if args.gpu_mem is not None:
        changes["gpu_memory_bytes"] = parse_bytes(args.gpu_mem, field="--gpu-mem")
        if args.gpu_tflops is None and not hw.has_gpu:
            raise ValueError("--gpu-mem describes a GPU this machine lacks: give its --gpu-tflops too")
        changes.setdefault("gpu_name", "hypothetical GPU")
    if args.gpu_tflops is not None:
        changes["gpu_flops"] = args.gpu_tflops * 1e12
        if not hw.pcie_bytes_per_s and args.pcie_bw is None:
            changes["pcie_bytes_per_s"] = 25 * GB
        if args.gpu_mem is None and not hw.gpu_memory_bytes:
            raise ValueError("--gpu-tflops describes a GPU this machine lacks: give its --gpu-mem too")
    if args.pcie_bw is not None:
        changes["pcie_bytes_per_s"] = args.pcie_bw * GB
    if args.host_mem is not None:
        changes["host_memory_bytes"] = parse_bytes(args.host_mem, field="--host-mem")
    if args.ssd_bw is not None:
        try:
            r, w = (float(x) for x in args.ssd_bw.split("/"))
        except ValueError:
            raise ValueError(f"--ssd-bw: expected READ/WRITE in GB/s such as 6.8/4.5, got {args.ssd_bw!r}") from None
        changes.update(ssd_read_bytes_per_s=r * GB, ssd_write_bytes_per_s=w * GB)
    if args.ssds is not None:
        changes["ssds"] = args.ssds
    if args.cpu_adam is not None:
        changes["cpu_adam_params_per_s"] = args.cpu_adam * 1e6
    if args.disk is not None:
        changes["disk_bytes"] = parse_bytes(args.disk, field="--disk")
    if not changes:
        return hw
    # the described machine is no longer the one probed (or the preset): its name says what was changed
    given = [f"--{flag.replace('_', '-')} {value}" for flag, value in vars(args).items()
             if flag in _HARDWARE_FLAGS and value is not None]
    base = "this machine's probe" if hw.measured and hw.name == PROBED_NAME else hw.name
    changes["name"] = f"{base} with {', '.join(given)}"
    return hw.with_overrides(**changes)


#: the flags that change the hardware described (each makes the plan a prediction for a hypothetical machine)
_HARDWARE_FLAGS = ("gpu_mem", "gpu_tflops", "pcie_bw", "host_mem", "ssd_bw", "ssds", "cpu_adam", "disk")
#: the name ``terastack probe`` gives the machine it measured
PROBED_NAME = "this machine (probed)"


#: profiles made this process: (model, batch, seq_len, dtype, lora rank, unit times file's mtime) -> profile
_PROFILES: dict = {}


def plan_model(args, hw):
    """(profile, plan or None, PlanError or None)."""
    from terastack.dtypes import COMPUTE_DTYPES, to_dtype
    from terastack.training.model_registry import resolve_model
    from terastack.llm.trainer_config import LoraSpec
    from terastack.llm.engine.profile import profile_config, unit_times_path
    from terastack.plan.llm_planner import LLMPlanner, PlanError
    from terastack.llm.vocab_slices import slice_bound
    from terastack.units import parse_bytes

    dtype = args.dtype or ("bfloat16" if hw.has_gpu else "float32")
    calibrate = args.calibrate or args.recalibrate
    times = unit_times_path()
    # `--largest` plans each model once per optimizer format (and a bench plans
    # each rung per format); the profile depends on none of the format, the budgets or the machine, so one
    # process profiles a model at a shape once, while the measured unit times it read stay the same
    vocab_slice = parse_bytes(args.vocab_slice, field="--vocab-slice")
    # the profile's units depend on the format where it decides the vocabulary slices ([Note: vocabulary slices])
    sliced = slice_bound(vocab_slice, args.optimizer)
    key = (args.model, args.batch_size, args.seq_len, dtype, args.lora, args.base_format, sliced,
           times.stat().st_mtime_ns if times.exists() else None)
    profile = None if calibrate else _PROFILES.get(key)
    if profile is None:
        hf_config, _ = resolve_model(args.model)
        profile = profile_config(hf_config, batch=args.batch_size, seq_len=args.seq_len,
                                 dtype=to_dtype(dtype, allowed=COMPUTE_DTYPES), name=args.model,
                                 lora=(LoraSpec(r=args.lora, alpha=2 * args.lora, base_format=args.base_format)
                                       if args.lora else None),
                                 calibrate=calibrate, times_file=times, recalibrate=args.recalibrate,
                                 vocab_slice=vocab_slice, optimizer=args.optimizer)
        if not calibrate:
            _PROFILES[key] = profile
    profile = copy.deepcopy(profile)  # callers may change theirs
    mem = hw.host_memory_bytes or (64 << 30)
    if hw.has_gpu:
        device_budget = args.device_budget or int(0.9 * hw.gpu_memory_bytes)
        host_budget = args.host_budget or int(0.8 * mem)
    else:
        device_budget = args.device_budget or mem // 4
        host_budget = args.host_budget or mem // 2
    planner = LLMPlanner(LLMPlanner.Config(device_budget=device_budget, host_budget=host_budget,
                                           policy=args.policy, optimizer_schedule="deferred" if args.clip else "eager",
                                           optimizer=args.optimizer))
    try:
        plan = planner.plan(profile, hw)
    except PlanError as exc:
        return profile, None, exc
    short = disk_shortfall(plan, profile, hw)
    return (profile, plan, None) if short is None else (profile, None, short)


def disk_shortfall(plan, profile, hw):
    """A PlanError naming the disk when what ``plan`` rests on the SSD is more than ``hw.disk_bytes`` (0: not
    known, not checked), else None."""
    from terastack.plan.llm_planner import PlanError

    placed = plan.placement_bytes(profile)
    on_ssd = placed["state_ssd"] + placed.get("compute_ssd", 0)
    if not hw.disk_bytes or on_ssd <= hw.disk_bytes:
        return None
    return PlanError("disk", needed=on_ssd, available=hw.disk_bytes, limit=hw.disk_bytes,
                     what=f"{profile.model}: the training state the plan rests on the SSD (--disk)")


#: exit status when the job does not fit: a script tells it from a plan (0) and from an error in what it asked
#: (2, like every terastack command's one-line errors and argparse's usage errors)
NO_FIT = 3


def run(args: argparse.Namespace) -> int:
    if args.base_format == "nf4" and not args.lora:
        raise ValueError("--base-format: nf4 streams a frozen LoRA base; give --lora R")
    hw = resolve_hardware(args)
    if args.largest:
        from terastack.llm.plan_largest import run_largest

        return run_largest(plan_model, args, hw)
    if not args.model:
        raise ValueError("--model: which model to plan (or --largest)")
    profile, plan, error = plan_model(args, hw)
    # the training state the store holds: fp32 masters and moments, compute copies and frozen weights -- the
    # same bytes the placement lists (gradients only pass through, so they are not part of it)
    from terastack.plan.optimizer_formats import optimizer_format

    state = profile.state_bytes(optimizer_format(args.optimizer))
    head = (f"{profile.model}: {profile.total_params / 1e9:.3g}B parameters ({profile.trainable_params / 1e9:.3g}B "
            f"trainable), training state {format_bytes(state)}, batch {profile.batch} x {profile.seq_len} tokens")
    machine = f"{hw.name}" + ("" if hw.measured else " (hypothetical: every figure is a prediction)")
    if args.json:
        out = {"model": profile.model, "parameters": profile.total_params,
               "trainable_parameters": profile.trainable_params, "training_state_bytes": state,
               "batch": profile.batch, "seq_len": profile.seq_len, "hardware": hw.to_dict(),
               "prediction": not hw.measured, "fits": plan is not None}
        if plan is not None:
            out["plan"] = plan.summary()
            out["bytes_per_parameter_per_step"] = plan.bytes_per_parameter(profile)
            out["placement_bytes"] = plan.placement_bytes(profile)
            out["policies"] = list(plan.policies)
        else:
            out["short"] = {"budget": error.budget, "needed": error.needed, "available": error.available,
                            "shortfall": error.shortfall, "message": str(error)}
        print(json.dumps(out, indent=1, default=str))
        return 0 if plan is not None else NO_FIT
    print(head)
    print(f"on {machine}")
    if plan is None:
        print(f"does not fit: {error}")
        return NO_FIT
    print(plan.describe(profile))
    p = plan.prediction
    label = "predicted" if not hw.measured else "predicted on this machine"
    print(f"fits: {label} {p.step_s:.3g} s per step, {p.tokens_per_s:.4g} tokens/s; bottleneck: {p.bottleneck}",
          file=sys.stdout)
    per = plan.bytes_per_parameter(profile)
    print(f"SSD bytes per parameter per step ({args.optimizer}): {per['read']:.3g} read + {per['written']:.3g} "
          f"written", file=sys.stdout)
    return 0

