"""``terastack plan llm``: will this job fine-tune on this (or that) machine, how, and how fast?

[Note: planning the job finetune would run]
A plan is of a job: the ``--config`` file, flags and ``key=value`` overrides ``terastack finetune`` reads, with
its defaults (one copy of every setting: :mod:`terastack.training.job`), planned as the offloaded engine plans it
(:func:`terastack.llm.machine.make_plan` over the job's :class:`~terastack.llm.trainer_config.TrainerConfig`: the
budgets, "auto" resolved on the machine planned for, and the built-in model's; the optimizer format and schedule;
the accumulation order; the activation policy; the batch). Only what a plan cannot do as a run does differs:

    the model      profiled on the meta device (no weights, any size; a deep stack as two layers, repeated)
    the machine    this machine's probe, or a described one: ``--hardware`` a preset or a probe file, and the
                   hardware flags (``--gpu-mem``, ``--host-mem``...) make it a hypothetical one whose every
                   figure is a prediction; an "auto" GPU budget takes the GPU's memory as free
    unit times     with ``offload.calibrate`` (the default) the times this machine keeps for the job's units
                   (those finetune's calibration measured), FLOP rates for units it has none of; ``--time-units``
                   times those now, as finetune would, ``--recalibrate`` every unit again (this machine only: a
                   plan never times units at a batch larger than it planned)
    the disk       the free space of the job's store directories (``--store``) on this machine, else the
                   machine's

Settings no plan depends on (the learning rate, the data, the output) are read and checked all the same. The
answer: a placement, the predicted step, tokens/s and bottleneck -- or the budget that is short and by how much,
or that the disk cannot hold the state the plan rests there. With ``--largest``, the largest built-in model each
optimizer format fully fine-tunes on the machine, and whether a 70B LoRA over an NF4 base fits
(:mod:`terastack.llm.plan_largest`). Exit status: 0 with a plan, 3 when the job does not fit (:data:`NO_FIT`), 2
on an error.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from terastack.units import format_bytes, parse_bytes

GB = 1e9


def add_arguments(p: argparse.ArgumentParser) -> None:
    from terastack.training.job import add_job_arguments

    p.add_argument("--config", default=None, metavar="FILE",
                   help="a job file, as terastack finetune reads it: the plan is of that job. Flags given on the "
                        "command line win over the file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings that win over the file and the flags, as terastack finetune takes them")
    add_job_arguments(p, skip=("disdp",))
    m = p.add_argument_group("the machine planned for", "default: this machine's probe (run if not cached); "
                             "--hardware also takes a preset: rtx4090-workstation, a100-server, h200. Each flag "
                             "below makes it a hypothetical machine")
    m.add_argument("--gpu-mem", default=None, help="accelerator memory, e.g. 24GB (a hypothetical GPU)")
    m.add_argument("--gpu-tflops", type=float, default=None, help="accelerator matmul rate in TFLOP/s")
    m.add_argument("--pcie-bw", type=float, default=None, help="host<->device GB/s each way (default 25 with a GPU)")
    m.add_argument("--host-mem", default=None, help="host memory, e.g. 256GB")
    m.add_argument("--ssd-bw", default=None, metavar="R/W", help="per-SSD read/write GB/s, e.g. 6.8/4.5")
    m.add_argument("--ssds", type=int, default=None, help="number of SSDs striped together")
    m.add_argument("--disk", default=None, help="disk space the store may take, e.g. 4TB (default: the preset's, "
                                                "the free space of --store, or the free space the probe saw)")
    m.add_argument("--cpu-adam", type=float, default=None, metavar="MPARAMS", help="CPU AdamW rate, M params/s")
    o = p.add_argument_group("this plan")
    o.add_argument("--largest", action="store_true",
                   help="instead of the job's model: the largest built-in model each optimizer format fully "
                        "fine-tunes on the machine, with its bytes per parameter per step, and a 70B LoRA over an "
                        "NF4 base")
    o.add_argument("--time-units", action="store_true",
                   help="time the job's distinct units this machine keeps no times for, as finetune's calibration "
                        "does, and plan from them (kept beside the probe: the same question gets the same answer)")
    o.add_argument("--recalibrate", action="store_true", help="like --time-units, but time every unit again")
    o.add_argument("--json", action="store_true", help="print the plan (or what is short) as JSON")


def read_job(args):
    """The job of the command line: file < flags < overrides ([Note: job config resolution])."""
    from terastack.training.job import job_flags, resolve_job

    return resolve_job(file=args.config, flags=job_flags(args), overrides=args.overrides or [])


def resolve_hardware(args, job=None):
    """The machine to plan for: a preset, a probe file (the job's ``offload.hardware``), or this machine's probe;
    the hardware flags change it (hypothetical)."""
    from pathlib import Path

    from terastack.plan.hardware import PRESETS, Hardware

    given = job.offload.hardware if job is not None else None
    if given in PRESETS:
        hw = PRESETS[given]
    elif given:
        try:
            hw = Hardware.from_dict(json.loads(Path(given).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"--hardware: {given!r} is neither a preset ({', '.join(PRESETS)}) nor a "
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


def this_machine(args, job) -> bool:
    """Whether the plan is for this machine as probed (its kept unit times and its disks are this machine's)."""
    return job.offload.hardware is None and not any(getattr(args, f, None) is not None for f in _HARDWARE_FLAGS)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanQuestion:
    """What a plan of a job on a machine is made of, resolved from the job's settings and defaults ([Note:
    planning the job finetune would run]); two jobs with equal questions get the same plan."""

    model: str
    source: str                 # the model's own description (model_source), RoPE scaling beside it
    model_dir: str | None
    config: object              # the job's TrainerConfig, with what the engine decides where the job does not
    device: str                 # where the units compute: "cpu" or "cuda"
    dtype: str
    lora: object | None         # a LoraSpec with its base format decided
    vocab_slice: int            # the bound the job's vocab_slice sets under its optimizer format
    budgets: tuple              # (device, host) bytes, or ("memory", bytes) for one budget split by the planner
    inline_updates: bool
    unit_times: str             # "flops", "kept" (this machine's kept times), "time-missing" or "recalibrate"
    disk: int                   # bytes the store may take (0: not known)

    def planner_config(self):
        """The planner's settings of this question (without a single memory budget's split)."""
        device_budget, host_budget = self.budgets if self.budgets[0] != "memory" else (0, 0)
        return self.config.planner_config(device_budget=device_budget, host_budget=host_budget,
                                          inline_updates=self.inline_updates)

    def profile_key(self) -> tuple:
        c = self.config
        return (self.model, self.source, c.batch_size, c.seq_len, self.dtype, repr(self.lora), self.vocab_slice,
                bool(c.packed))


def model_source(job) -> tuple[str, str | None]:
    """(what describes the job's model, its directory or None), read without building its config: a built-in
    model's fields, or a local model's config.json; a Hub id (or anything else) as transformers reads it. The
    job's RoPE scaling goes beside it."""
    import os

    from terastack.training.job_runner import resolve_job_model
    from terastack.training.model_registry import DEFAULT_MODEL, MODELS, config_json_of

    name = job.model.path or DEFAULT_MODEL
    scaling = f" | rope {job.model.rope_scaling}" if job.model.rope_scaling else ""
    config = config_json_of(name)
    if config is not None and os.path.isfile(config):
        with open(config) as f:
            return f.read() + scaling, (name if os.path.isdir(name) else None)
    if name in MODELS and not os.path.exists(name):
        return json.dumps(MODELS[name], sort_keys=True) + scaling, None
    model = resolve_job_model(job)   # a Hub id, or the error of a model that is not there
    return model.hf_config.to_json_string() + scaling, model.model_dir


def question(job, hw, *, here: bool, time_units: bool = False, recalibrate: bool = False) -> PlanQuestion:
    """The :class:`PlanQuestion` of ``job`` on ``hw`` (``here``: this machine, as probed)."""
    import torch

    from terastack.disk_room import free_on
    from terastack.llm.lora import resolve_base_format
    from terastack.llm.machine import budgets, resolve_dtype
    from terastack.llm.trainer_config import TrainerConfig, builtin_model_budget
    from terastack.llm.vocab_slices import slice_bound
    from terastack.training.job_runner import resolve_job_model

    source, model_dir = model_source(job)
    config = TrainerConfig(job, **builtin_model_budget(job, lambda: resolve_job_model(job).hf_config))
    if config.device == "auto":
        device = "cuda" if hw.has_gpu else "cpu"
    elif config.device.startswith("cuda") and not hw.has_gpu:
        raise ValueError(f"--device: {config.device}, but {hw.name} has no GPU")
    else:
        device = "cuda" if config.device.startswith("cuda") else "cpu"
    if (time_units or recalibrate) and not here:
        raise ValueError(f"--{'recalibrate' if recalibrate else 'time-units'}: units are timed on this machine; "
                         f"the plan is for {hw.name}")
    lora = config.lora
    if lora is not None:
        import dataclasses

        lora = dataclasses.replace(lora, base_format=resolve_base_format(lora.base_format, model_dir))
    dtype = resolve_dtype(config.dtype, torch.device(device))
    plan_budgets = (("memory", config.memory_budget) if config.memory_budget is not None
                    else budgets(config, torch.device(device), hw))
    times = ("flops" if not config.calibrate or not here else "recalibrate" if recalibrate
             else "time-missing" if time_units else "kept")
    disk = free_on(job.store.dirs.split(",")) if job.store.dirs and here and hw.disk_bytes else hw.disk_bytes
    return PlanQuestion(model=job.model.path or "tiny-llama", source=source, model_dir=model_dir, config=config,
                        device=device, dtype=str(dtype).removeprefix("torch."), lora=lora,
                        vocab_slice=slice_bound(config.vocab_slice, config.optimizer), budgets=plan_budgets,
                        inline_updates=(device != "cuda" if config.inline_updates is None
                                        else bool(config.inline_updates)),
                        unit_times=times, disk=disk)


#: profiles made this process: PlanQuestion.profile_key() and the unit times asked for -> profile
_PROFILES: dict = {}
#: the modules whose code makes a profile: a kept profile is one of the code that reads it
_PROFILE_CODE = ("terastack.llm.engine.profile", "terastack.llm.engine.meta_kernels", "terastack.llm.engine.causal_loss",
                 "terastack.llm.model", "terastack.llm.vocab_slices", "terastack.llm.lora", "terastack.plan.llm_profile",
                 "terastack.plan.base_formats", "terastack.training.hf.model_files")


def profile_cache_file(q: PlanQuestion, times_mtime) -> Path:
    """[Note: kept profiles]
    Profiling a model means importing transformers' model code and building its skeleton: seconds, where the
    plan itself takes one. So ``plan llm`` keeps each profile it makes beside the machine's probe, under a key
    of everything the profile depends on -- the question's model, batch, dtype, adapter, vocabulary slices and
    packing, the versions of torch and transformers, the source of the modules that make a profile, and the
    unit times file it read -- and the same question asked again reads it (the same answer, without the
    imports). A plan that times units makes its profile afresh."""
    import hashlib
    import importlib.util
    from importlib.metadata import version

    from terastack.plan.hardware import probe_cache_path

    digest = hashlib.sha256(repr((q.profile_key(), q.unit_times, times_mtime, version("torch"),
                                  version("transformers"), PROFILE_FORMAT)).encode())
    for module in _PROFILE_CODE:
        digest.update(Path(importlib.util.find_spec(module).origin).read_bytes())
    return probe_cache_path().with_name("profiles") / f"{digest.hexdigest()[:32]}.json"


#: the kept profiles' format (a change makes every kept profile a miss)
PROFILE_FORMAT = 2


def profile_of(q: PlanQuestion):
    """The job's model profiled at the job's batch (meta tensors; kept for the process and beside the probe:
    [Note: kept profiles]), with the unit times the question asks for."""
    import torch

    from terastack.atomic import atomic_write_bytes
    from terastack.dtypes import COMPUTE_DTYPES, to_dtype
    from terastack.llm.engine.profile import profile_config, unit_times_path
    from terastack.plan.llm_profile import ModelProfile
    from terastack.training.job_runner import resolve_job_model

    times = unit_times_path()
    calibrate = q.unit_times != "flops"
    timing = q.unit_times in ("time-missing", "recalibrate")
    mtime = times.stat().st_mtime_ns if calibrate and times.exists() else None
    key = (q.profile_key(), q.unit_times, mtime)
    profile = None if timing else _PROFILES.get(key)
    kept = None if timing else profile_cache_file(q, mtime)
    if profile is None and kept is not None and kept.is_file():
        try:
            profile = ModelProfile.from_dict(json.loads(kept.read_text()))
        except (OSError, ValueError, TypeError):
            profile = None   # a damaged file is made again
    if profile is None:
        profile = profile_config(resolve_job_model(q.config.job).hf_config, batch=q.config.batch_size,
                                 seq_len=q.config.seq_len, dtype=to_dtype(q.dtype, allowed=COMPUTE_DTYPES),
                                 name=q.model, lora=q.lora, calibrate=calibrate, device=torch.device(q.device),
                                 times_file=times, recalibrate=q.unit_times == "recalibrate",
                                 vocab_slice=q.config.vocab_slice, optimizer=q.config.optimizer,
                                 packed=bool(q.config.packed), time_missing=timing)
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            # in the profile's own order: the planner reads its tensors in that order (ties go to the first)
            atomic_write_bytes(kept, json.dumps(profile.to_dict()).encode())
    _PROFILES[key] = profile
    return copy.deepcopy(profile)  # callers may change theirs


def plan_model(job, hw, args):
    """(profile, plan or None, PlanError or None) of ``job`` on ``hw``, ``args`` the command's."""
    import torch

    from terastack.llm.machine import make_plan
    from terastack.plan.llm_planner import PlanError

    q = question(job, hw, here=this_machine(args, job), time_units=args.time_units, recalibrate=args.recalibrate)
    profile = profile_of(q)
    try:
        _, plan = make_plan(q.config, profile, hw, torch.device(q.device), inline_updates=q.inline_updates,
                            name=q.model, described=True)
    except PlanError as exc:
        return profile, None, exc
    short = disk_shortfall(plan, profile, q.disk)
    return (profile, plan, None) if short is None else (profile, None, short)


def disk_shortfall(plan, profile, disk: int):
    """A PlanError naming the disk when what ``plan`` rests on the SSD is more than ``disk`` bytes (0: not known,
    not checked), else None."""
    from terastack.plan.llm_planner import PlanError

    placed = plan.placement_bytes(profile)
    on_ssd = placed["state_ssd"] + placed.get("compute_ssd", 0)
    if not disk or on_ssd <= disk:
        return None
    return PlanError("disk", needed=on_ssd, available=disk, limit=disk,
                     what=f"{profile.model}: the training state the plan rests on the SSD (--disk)")


#: exit status when the job does not fit: a script tells it from a plan (0) and from an error in what it asked
#: (2, like every terastack command's one-line errors and argparse's usage errors)
NO_FIT = 3


def unit_times_line(profile) -> str:
    """Where the plan's unit times come from."""
    measured = sum(1 for u in profile.units if u.fwd_s is not None)
    if measured == len(profile.units):
        return "unit times: measured on this machine"
    if measured == 0:
        return "unit times: from the machine's FLOP rate (--time-units times them on this machine)"
    return (f"unit times: measured on this machine for {measured} of {len(profile.units)} units, the others from "
            "its FLOP rate (--time-units times them)")


def run(args: argparse.Namespace) -> int:
    from terastack.training.job import other_engine_note

    job = read_job(args)
    note = other_engine_note(job, "disdp", command="terastack plan llm")  # [Note: settings of the other engine]
    if note:
        print(note, file=sys.stderr)
    hw = resolve_hardware(args, job)
    if args.largest:
        from terastack.llm.plan_largest import run_largest

        return run_largest(plan_model, job, args, hw)
    profile, plan, error = plan_model(job, hw, args)
    # the training state the store holds: fp32 masters and moments, compute copies and frozen weights -- the
    # same bytes the placement lists (gradients only pass through, so they are not part of it)
    from terastack.plan.optimizer_formats import optimizer_format

    t = job.training
    state = profile.state_bytes(optimizer_format(t.optimizer))
    accum = f", {t.grad_accum} micro-batches a step" if t.grad_accum > 1 else ""
    head = (f"{profile.model}: {profile.total_params / 1e9:.3g}B parameters ({profile.trainable_params / 1e9:.3g}B "
            f"trainable), training state {format_bytes(state)}, batch {profile.batch} x {profile.seq_len} "
            f"tokens{accum}")
    machine = f"{hw.name}" + ("" if hw.measured else " (hypothetical: every figure is a prediction)")
    if args.json:
        out = {"model": profile.model, "parameters": profile.total_params,
               "trainable_parameters": profile.trainable_params, "training_state_bytes": state,
               "batch": profile.batch, "seq_len": profile.seq_len, "grad_accum": t.grad_accum,
               "optimizer": t.optimizer, "hardware": hw.to_dict(), "prediction": not hw.measured,
               "measured_units": sum(1 for u in profile.units if u.fwd_s is not None), "fits": plan is not None}
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
    print(unit_times_line(profile))
    p = plan.prediction
    label = "predicted" if not hw.measured else "predicted on this machine"
    print(f"fits: {label} {p.step_s:.3g} s per step, {p.tokens_per_s:.4g} tokens/s; bottleneck: {p.bottleneck}",
          file=sys.stdout)
    per = plan.bytes_per_parameter(profile)
    print(f"SSD bytes per parameter per step ({t.optimizer}): {per['read']:.3g} read + {per['written']:.3g} "
          f"written", file=sys.stdout)
    return 0
