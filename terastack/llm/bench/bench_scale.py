"""``terastack bench llm-scale``: the largest model each system fully fine-tunes in a fixed amount of memory.

A ladder of Llama models (default 0.15B, 0.55B, 1.1B and 3.4B parameters: ``llama-150m``, ``llama-550m``,
``llama-1.1b`` with TinyLlama's shape, ``openllama-3b`` with OpenLLaMA-3B's) is trained at seq 256, batch 1 by

* ``terastack``: the offloading trainer under one memory budget (default 4 GiB, ``--budget``), its state on
  the SSD, one row per optimizer state format (``--optimizer adamw,adamw8bit,adafactor``); the planner's
  predicted step time and bytes per parameter per step by kind are reported beside the measured ones (the byte
  ledger's: [Note: the byte ledger] in terastack.llm.engine.byte_ledger);
* ``zero_infinity``: DeepSpeed ZeRO-3 with parameters and optimizer state offloaded to NVMe, every parameter on
  the NVMe (``max_in_cpu`` 0) and its swap buffers sized from the model ([Note: ZeRO-Infinity configured for the
  model] in terastack.llm.bench.zero_infinity);
* ``in_memory``: the unmodified model and ``torch.optim.AdamW`` in RAM.

[Note: the RSS watchdog]
Each system runs in its own child process (``terastack.llm.bench.bench_worker``) in its own session. The parent
reads the resident memory of the child and all its descendants from ``/proc`` every 50 ms; when it passes
``--rss-limit`` (default min(0.8 x RAM, 20 GiB), below what the machine has, so the kernel's OOM killer never
decides a result) the whole process group is killed and the system "does not fit" at that size. A child that
dies by SIGKILL it was not sent (the OOM killer), or that fails with an out-of-memory error, does not fit
either. A system that does not fit at one size is not tried at larger ones. A run that fails for another reason
(a configuration error, a timeout) is not "does not fit": it stops that system's ladder with its largest model
unmeasured (terastack.llm.bench.ladder_summary). Peak RSS is the whole process's, children included: the larger
of the watchdog's samples and the kernel's high-water mark the child reports.

Before each run, the state the system keeps on the disk (:data:`STATE_BYTES_PER_PARAM`; terastack's from its
optimizer format's spec, :func:`state_bytes_per_param`; with a margin) must fit on the free disk of ``--dir``; otherwise it is refused, naming both numbers. Every
file a rung writes is deleted after it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from terastack import trace
from terastack.bench_watchdog import tree_rss_bytes
from terastack.plan.hardware import save_probe
from terastack.llm.bench.bench_llm import deepspeed_missing
from terastack.llm.bench.ladder_summary import entry_name, summarize
from terastack.llm.trainer_config import MEMORY_BUDGET_ENV
from terastack.memory import mem_total
from terastack.units import format_bytes, parse_bytes

#: rung names -> built-in models (terastack.training.model_registry); any built-in model name is a rung too
SIZES = {"tiny": "tiny-llama", "0.15b": "llama-150m", "0.55b": "llama-550m", "1.1b": "llama-1.1b",
         "3b": "openllama-3b"}
DEFAULT_SIZES = "0.15b,0.55b,1.1b,3b"
#: --quick: the smallest rung of the default ladder, fewer steps
QUICK_SIZES = "0.15b"
SYSTEMS = ("terastack", "zero_infinity", "in_memory")
#: bytes of training state per parameter each system keeps on the disk: terastack's fp32 weights (they are
#: the masters in fp32 training) and two AdamW moments (another format: :func:`state_bytes_per_param`) --
#: gradients live one unit at a time in memory;
#: ZeRO-Infinity's swapped parameters, fp32 master, two moments and gradients (16 bytes, the usual figure);
#: in-memory training none
STATE_BYTES_PER_PARAM = {"terastack": 12, "zero_infinity": 16, "in_memory": 0}
#: the disk pre-flight's margin over that: 10% plus 1 GiB (run files, allocation slack, DeepSpeed's buffers)
DISK_MARGIN = 0.10
DISK_SLACK = 1 << 30
#: what a child's stderr says when an allocation failed (torch's CPU allocator, CUDA, Python)
OOM_MARKERS = ("out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory",
               "Cannot allocate memory")

HEADLINE = ["max_params_terastack", "max_params_zero_infinity", "max_params_in_memory"]

PRESETS = {
    "smoke": ["--sizes", "tiny", "--systems", "terastack,in_memory", "--steps", "1", "--warmup", "1",
              "--seq-len", "32"],
    "quick": ["--quick"],
    "full": [],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default=None,
                   help=f"comma-separated rungs, smallest first: {', '.join(SIZES)} or any built-in model name "
                        f"(default {DEFAULT_SIZES})")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    p.add_argument("--optimizer", default="adamw",
                   help="terastack's optimizer state formats, comma-separated (adamw, adamw8bit, adafactor): one "
                        "terastack row per format (default adamw; the other systems run AdamW)")
    p.add_argument("--lora", type=int, default=None, metavar="R",
                   help="terastack rows train a LoRA adapter of rank R over a frozen random base, initialized "
                        "straight into the store (the other systems are refused: they run full fine-tuning only)")
    p.add_argument("--base-format", default="auto", choices=("auto", "nf4", "native"),
                   help="with --lora: how the frozen base rests and streams (lora.base_format)")
    p.add_argument("--budget", default="4GiB", help="terastack's memory budget (default 4GiB)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="terastack's compute dtype (store.dtype; auto: float32 on a CPU, bfloat16 on a GPU)")
    p.add_argument("--state-placement", default="auto", choices=("auto", "ssd"),
                   help="terastack's training state: where the plan puts it (auto), or all of it on the SSD (ssd: "
                        "a small model's bytes per parameter as a large one's)")
    p.add_argument("--activations", default="auto", choices=("auto", "keep", "host", "ssd", "recompute"),
                   help="terastack's activations: the planner's choice per layer (auto), or one policy for every "
                        "layer (recompute: only each layer's input is kept, so none of them crosses the SSD)")
    p.add_argument("--rss-limit", default=None,
                   help="kill a system whose resident memory passes this (default min(0.8 x RAM, 20GiB))")
    p.add_argument("--dir", default=None, help="directory on the SSD for stores and ZeRO-Infinity's swap files")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per optimizer step for every system (tokens/s counts all of them)")
    p.add_argument("--steps", type=int, default=2, help="measured steps per system (after --warmup)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds per system and rung before it is stopped")
    p.add_argument("--hardware", default=None,
                   help="a probe JSON (terastack probe --json) for terastack's predictions (default: the cached "
                        "probe, else a quick probe of --dir)")
    p.add_argument("--quick", action="store_true",
                   help=f"only the smallest rung ({QUICK_SIZES}), one measured step: a few minutes")


# ------------------------------------------------------------------ the watchdog
@dataclass(slots=True)
class ChildOutcome:
    returncode: int | None
    peak_rss_bytes: int
    killed_for_rss: bool
    timed_out: bool
    stderr_tail: str


def run_watched(cmd: list[str], *, rss_limit: int, timeout: float, env: dict | None = None,
                log: Path | None = None, poll_s: float = 0.05) -> ChildOutcome:
    """Run ``cmd`` in its own session; kill its process group when its tree's RSS passes ``rss_limit`` or after
    ``timeout`` seconds. See [Note: the RSS watchdog]."""
    log = log or Path(tempfile.mkstemp(prefix="terastack-scale-", suffix=".log")[1])
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **(env or {})},
                                start_new_session=True)
        peak, killed, timed_out = 0, False, False
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                rss = tree_rss_bytes(proc.pid)
                peak = max(peak, rss)
                if rss > rss_limit:
                    killed = True
                elif time.monotonic() > deadline:
                    timed_out = True
                if killed or timed_out:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(poll_s)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-8:])
    return ChildOutcome(returncode=proc.returncode, peak_rss_bytes=peak, killed_for_rss=killed,
                        timed_out=timed_out, stderr_tail=tail)


def classify(outcome: ChildOutcome, rss_limit: int) -> tuple[bool | None, str | None]:
    """(fits, reason): True/None for a run that finished; False when it ran out of memory; None (with the
    error) when it failed for another reason."""
    if outcome.killed_for_rss:
        return False, f"does not fit: resident memory passed the limit of {format_bytes(rss_limit)}"
    if outcome.timed_out:
        return None, "did not finish within --timeout"
    if outcome.returncode == -signal.SIGKILL:
        return False, "does not fit: killed by SIGKILL (the kernel's OOM killer)"
    if outcome.returncode != 0:
        if any(m.lower() in outcome.stderr_tail.lower() for m in OOM_MARKERS):
            return False, "does not fit: out of memory (" + outcome.stderr_tail.splitlines()[-1][:200] + ")"
        return None, f"failed (exit {outcome.returncode}): {outcome.stderr_tail[-400:]}"
    return True, None


# ------------------------------------------------------------------ the ladder
def resolve_sizes(spec: str) -> list[tuple[str, str]]:
    """[(rung label, built-in model name)] of a ``--sizes`` value."""
    from terastack.training.model_registry import MODELS

    out = []
    for label in (s.strip() for s in spec.split(",")):
        if not label:
            continue
        model = SIZES.get(label.lower(), label)
        if model not in MODELS:
            raise ValueError(f"--sizes: unknown rung {label!r} (known: {', '.join(SIZES)}, or a built-in model)")
        out.append((label, model))
    if not out:
        raise ValueError("--sizes: no rung given")
    return out


def parameter_count(model: str) -> int:
    from terastack.training.model_registry import hf_config
    from terastack.training.hf.model_files import build_skeleton

    return sum(p.numel() for p in build_skeleton(hf_config(model)).parameters())  # meta: no memory


def state_bytes_per_param(model: str, optimizer: str) -> float:
    """Bytes of terastack's fp32 training state per parameter of ``model`` with optimizer format ``optimizer``:
    the master and the format's state over the model's own shapes (AdamW: 12)."""
    from terastack.plan.optimizer_formats import optimizer_format
    from terastack.training.model_registry import hf_config
    from terastack.training.hf.model_files import build_skeleton

    fmt = optimizer_format(optimizer)
    params = list(build_skeleton(hf_config(model)).parameters())  # meta: no memory
    numel = sum(p.numel() for p in params)
    return (4 * numel + sum(fmt.state_bytes(tuple(p.shape)) for p in params)) / max(numel, 1)


def lora_disk_bytes_per_param(model: str, base_format: str) -> float:
    """Bytes per parameter of ``model`` a LoRA row keeps on the disk: the store's frozen base, initialized straight
    into it (its linear weights in NF4 with ``base_format`` nf4, the rest fp32; all fp32 with native: the compute
    dtype's bytes at most). The adapters and their state are a rounding error beside it. See [Note: pricing an
    NF4 base] in terastack.plan.base_formats."""
    import torch

    from terastack.plan.base_formats import nf4_bytes
    from terastack.training.model_registry import hf_config
    from terastack.training.hf.model_files import build_skeleton

    skeleton = build_skeleton(hf_config(model))  # meta: no memory
    numel = sum(p.numel() for p in skeleton.parameters())
    linear = [m.weight.numel() for name, m in skeleton.named_modules()
              if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")]
    store = 4 * numel
    if base_format == "nf4":
        store -= sum(4 * n - nf4_bytes(n) for n in linear)
    return store / max(numel, 1)


def disk_needed(params: int, system: str, per_param: float | None = None) -> int:
    """Bytes ``system`` needs on the disk for ``params`` parameters (``per_param``: its state's bytes per
    parameter when not :data:`STATE_BYTES_PER_PARAM`'s)."""
    per_param = STATE_BYTES_PER_PARAM[system] if per_param is None else per_param
    return int(params * per_param * (1 + DISK_MARGIN)) + DISK_SLACK if per_param else 0


def disk_refusal(params: int, system: str, free: int, directory: str, per_param: float | None = None) -> str | None:
    """Why ``system`` cannot train ``params`` parameters on ``free`` bytes of disk, or None."""
    need = disk_needed(params, system, per_param)
    if need <= free:
        return None
    return (f"refused: its state needs {need} bytes ({format_bytes(need)}) on {directory}, which has {free} bytes "
            f"({format_bytes(free)}) free")


def default_rss_limit() -> int:
    total = mem_total() or (16 << 30)
    return min(int(0.8 * total), 20 << 30)


def _row(label: str, model: str, system: str, params: int, **fields) -> dict:
    row = {"size": label, "model": model, "system": system, "optimizer": "adamw", "params": params, "fits": None,
           "step_s": None,
           "tokens_per_s": None, "peak_rss_bytes": None, "ssd_read_bytes_per_step": None,
           "ssd_write_bytes_per_step": None, "predicted_step_s": None, "prediction_error": None, "reason": None}
    row.update(fields)
    return row


def _run_system(system: str, model: str, params: int, args, workdir: Path, probe: Path, budget: int,
                rss_limit: int, optimizer: str = "adamw") -> dict:
    out = workdir / f"{system}.json"
    cmd = [sys.executable, "-m", "terastack.llm.bench.bench_worker", "--system", system, "--model", model,
           "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--grad-accum", str(args.grad_accum), "--dir", str(workdir),
           "--out", str(out)]
    env = None
    if system == "terastack":
        cmd += ["--process-memory-budget", str(budget), "--hardware", str(probe), "--optimizer", optimizer,
                "--state-placement", args.state_placement, "--dtype", args.dtype,
                "--activation-policy", args.activations]
        if args.lora:
            cmd += ["--lora", str(args.lora), "--base-format", args.base_format]
        env = dict(MEMORY_BUDGET_ENV)  # [Note: a memory budget bounds resident memory] (terastack.memory)
    elif system == "zero_infinity":
        cmd += ["--zero-max-in-cpu", "0"]   # the largest model in a fixed memory: every parameter on the NVMe
    outcome = run_watched(cmd, rss_limit=rss_limit, timeout=args.timeout, env=env, log=workdir / f"{system}.log")
    fits, reason = classify(outcome, rss_limit)
    result = json.loads(out.read_text()) if fits and out.exists() else {}
    if fits and not result:
        fits, reason = None, "the worker wrote no result"
    row = _row("", model, system, params, fits=fits, reason=reason, peak_rss_bytes=outcome.peak_rss_bytes,
               optimizer=optimizer)
    if system == "terastack" and args.lora:
        row.update(lora_rank=args.lora, base_format=args.base_format)
    if not result:
        return row
    measured = result["planned"] if system == "terastack" else result
    tokens = args.batch_size * args.seq_len * args.grad_accum
    row.update(step_s=measured["step_s"], tokens_per_s=tokens / measured["step_s"],
               ssd_read_bytes_per_step=measured["ssd_read_bytes_per_step"],
               ssd_write_bytes_per_step=measured["ssd_write_bytes_per_step"],
               peak_rss_bytes=max(outcome.peak_rss_bytes, result.get("process_peak_rss_bytes") or 0),
               losses=measured.get("losses"), setup_s=measured.get("setup_s"))
    if system == "terastack":
        pred = measured.get("predicted_step_s")
        row.update(predicted_step_s=pred, prediction_error=(pred / measured["step_s"] - 1 if pred else None),
                   memory_budget_bytes=budget, store_read_bytes_per_step=measured.get("store_read_bytes_per_step"),
                   store_write_bytes_per_step=measured.get("store_write_bytes_per_step"),
                   compute_s=measured.get("compute_s"), stall_s=measured.get("stall_s"),
                   update_s=measured.get("update_s"), disk_busy_share=measured.get("disk_busy_share"), plan=measured.get("plan"),
                   bytes_by_kind_per_step=measured.get("bytes_by_kind_per_step"))
        predicted = measured.get("predicted_bytes_by_kind") or {}
        kinds = row["bytes_by_kind_per_step"] or {}
        moved = sum(kinds.values())
        row["bytes_per_parameter_per_step"] = per_parameter(kinds, params) if kinds else None
        row["predicted_bytes_per_parameter_per_step"] = per_parameter(predicted, params) if predicted else None
        if predicted and moved:
            # the planner's bytes against the ledger's, all kinds together ([Note: the byte ledger])
            row["bytes_prediction_error"] = sum(predicted.values()) / moved - 1
    elif system == "zero_infinity":
        row["deepspeed"], row["offload_param"] = result.get("deepspeed"), result.get("offload_param")
    return row


def per_parameter(by_kind: dict, params: int) -> dict:
    """Bytes per parameter per step of a step's bytes by kind (``<kind>_read`` / ``<kind>_written``): read,
    written, and each kind that moved any."""
    n = max(params, 1)
    return {"read": sum(v for k, v in by_kind.items() if k.endswith("_read")) / n,
            "written": sum(v for k, v in by_kind.items() if k.endswith("_written")) / n,
            "by_kind": {k: v / n for k, v in by_kind.items() if v}}


def _hardware(args, base: Path):
    """The machine terastack's planner predicts for: ``--hardware``, the cached probe, or a quick probe."""
    from terastack.plan.hardware import load_probe
    from terastack.probe import load_or_measure

    if args.hardware:
        hw = load_probe(args.hardware)
        if hw is None:
            raise FileNotFoundError(f"--hardware: {args.hardware} does not exist")
        return hw
    return load_or_measure(str(base), quick=True)


def measure(args: argparse.Namespace) -> dict:
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise ValueError(f"--systems: unknown {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    if args.quick:
        args.sizes = args.sizes or QUICK_SIZES
        args.steps = min(args.steps, 1)
    rungs = resolve_sizes(args.sizes or DEFAULT_SIZES)
    optimizers = resolve_optimizers(args.optimizer)
    if args.lora is not None and args.lora < 1:
        raise ValueError(f"--lora: the adapter's rank must be >= 1, got {args.lora}")
    if args.lora is None and args.base_format == "nf4":
        raise ValueError("--base-format nf4: the base format of a LoRA run; give --lora R")
    budget = parse_bytes(args.budget, field="--budget")
    rss_limit = parse_bytes(args.rss_limit, field="--rss-limit") if args.rss_limit else default_rss_limit()
    if args.grad_accum < 1:
        raise ValueError(f"--grad-accum: must be >= 1, got {args.grad_accum}")
    if args.steps < 1 or args.warmup < 0:
        raise ValueError(f"--steps/--warmup: need >= 1 measured step and >= 0 warm-up, got {args.steps}/{args.warmup}")
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    hw = _hardware(args, base) if "terastack" in systems else None
    result: dict = {"sizes": [label for label, _ in rungs], "systems": systems, "memory_budget_bytes": budget,
                    "rss_limit_bytes": rss_limit, "seq_len": args.seq_len, "batch_size": args.batch_size,
                    "steps": args.steps, "warmup": args.warmup, "grad_accum": args.grad_accum, "dir": str(base),
                    "optimizers": optimizers, "lora_rank": args.lora,
                    "base_format": args.base_format if args.lora else None, "rows": []}
    stopped: dict[str, str] = {}
    if "zero_infinity" in systems and (why := deepspeed_missing()):
        stopped["zero_infinity"] = f"not run: {why}"
    if args.lora:
        for system in systems:
            if system != "terastack":  # they are the full fine-tuning baselines: no adapter, no 4-bit base
                stopped[system] = f"not run: --lora trains terastack rows only ({system} runs full fine-tuning)"
    entries = [(s, o) for s in systems for o in (optimizers if s == "terastack" else ("adamw",))]
    for label, model in rungs:
        params = parameter_count(model)
        for system, optimizer in entries:
            entry = entry_name(system, optimizer)
            per_param = None
            if system == "terastack":
                per_param = (lora_disk_bytes_per_param(model, args.base_format) if args.lora
                             else state_bytes_per_param(model, optimizer))
            refusal = disk_refusal(params, system, shutil.disk_usage(base).free, str(base), per_param)
            if refusal or entry in stopped or system in stopped:
                result["rows"].append(_row(label, model, system, params, optimizer=optimizer,
                                           reason=refusal or stopped.get(entry) or stopped[system]))
                continue
            workdir = Path(tempfile.mkdtemp(prefix=f"terastack-scale-{label}-", dir=base))
            try:
                probe = save_probe(hw, workdir / "probe.json") if hw is not None else None
                print(f"bench llm-scale: {label} ({params / 1e9:.2f}B) {entry} ...", file=sys.stderr, flush=True)
                with trace.span(f"{label} {entry}", track="bench"):
                    row = _run_system(system, model, params, args, workdir, probe, budget, rss_limit, optimizer)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            row["size"] = label
            if per_param is not None:
                row["state_bytes_per_param"] = per_param   # what its rung's state keeps on the disk, per parameter
            if hw is not None and row.get("ssd_read_bytes_per_step") is not None:
                # the step's own bytes at the probe's rates (reads and writes at once where it measured both): no
                # schedule moves them faster
                row["io_floor_s"] = hw.ssd_seconds(row["ssd_read_bytes_per_step"], row["ssd_write_bytes_per_step"])
            result["rows"].append(row)
            print(f"  {_describe(row)}", file=sys.stderr, flush=True)
            if row["fits"] is not True:
                stopped[entry] = f"not tried: {entry} did not run at {label} ({row['reason']})"
    summarize(result, SYSTEMS)
    return result


def resolve_optimizers(spec: str) -> list[str]:
    """The optimizer state formats of an ``--optimizer`` value (each checked against the registered specs)."""
    from terastack.plan.optimizer_formats import optimizer_format

    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("--optimizer: no optimizer state format given")
    for name in names:
        try:
            optimizer_format(name)
        except ValueError as exc:
            raise ValueError(f"--{exc}") from None
    return list(dict.fromkeys(names))


def _describe(row: dict) -> str:
    if not row["fits"]:
        return row["reason"]
    text = (f"{row['step_s']:.2f} s/step, peak RSS {format_bytes(row['peak_rss_bytes'])}, SSD "
            f"{format_bytes(int(row['ssd_read_bytes_per_step']))} read / "
            f"{format_bytes(int(row['ssd_write_bytes_per_step']))} written per step")
    if row.get("compute_s") is not None:
        planned = (row.get("plan") or {}).get("predicted_optimizer_s") or 0
        text += (f"; compute {row['compute_s']:.2f} s (updates {row.get('update_s') or 0:.2f} s, planned "
                 f"{planned:.2f} s), waits {row['stall_s']:.2f} s, disk busy "
                 f"{100 * row['disk_busy_share']:.0f}% of the step, its bytes at the probe's rates "
                 f"{row.get('io_floor_s') or 0:.2f} s")
    if row.get("prediction_error") is not None:
        text += f"; predicted {row['predicted_step_s']:.2f} s ({100 * row['prediction_error']:+.0f}%)"
    if row.get("bytes_per_parameter_per_step"):
        b, p = row["bytes_per_parameter_per_step"], row.get("predicted_bytes_per_parameter_per_step") or {}
        text += f"; {b['read']:.3g} + {b['written']:.3g} bytes per parameter read + written"
        if p:
            text += f" (planned {p['read']:.3g} + {p['written']:.3g})"
    if row.get("bytes_prediction_error") is not None:
        text += f", its bytes {100 * row['bytes_prediction_error']:+.1f}%"
    return text
