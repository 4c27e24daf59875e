"""``terastack bench llm``: offloaded fine-tuning vs DeepSpeed ZeRO-Infinity and in-memory PyTorch AdamW.

One run, one model (default ``llama-150m``: Llama architecture, 148M parameters, seq 256, batch 1), one
machine. Each system runs in its own process (so peak RSS is its own), one after the other:

* ``in_memory``: the unmodified model and ``torch.optim.AdamW`` (fused) in RAM -- the speed to match;
* ``terastack``: the offloading trainer with a host budget of a quarter of the training state (16 bytes a
  parameter), so most of the state lives on the SSD, as in ZeRO-Infinity's run; then the ablations in the same
  process: active gradient offloading off, every layer recomputed, every layer swapped to the SSD;
* ``host_resident``: terastack with a host budget holding the whole training state (no SSD traffic), its steps
  alternating with in-memory AdamW's in one process (``slowdown_vs_in_memory_host_resident``): what terastack's
  own machinery costs, measured so that a busy machine's drift between processes does not pass for it;
* ``small_budget``: terastack with one memory budget for device and host tiers together (on a CPU the device
  tier is host memory too) of a quarter of the training state (``--budget-fraction``), split between the
  tiers by the planner; peak RSS above the interpreter's must stay under that budget;
* ``zero_infinity``: DeepSpeed ZeRO-3 with parameters and optimizer state offloaded to NVMe (on CPU here).

Ratios compare step times (median of the measured steps after warm-up); SSD bytes per step are what each
process read from and wrote to storage (/proc/self/io). Beside the host-resident headline, two figures less
exposed to a shared machine: ``host_resident_paired_ratio_median`` (the median of the ratios of steps run back
to back on the same batch) and ``host_resident_cpu_ratio`` (process CPU seconds per step, which do not count
time other tenants take).

Of the quarter budget's slowdown, ``io_contention_share`` is the part the planner attributes to SSD traffic
slowing the CPU's compute beside it: the probe's ``cpu_io_slowdown_per_gbps`` times the step's measured SSD
GB/s, applied to the in-memory step (``io_contention_s``), over terastack's step minus the in-memory step.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import statistics
import sys
import tempfile
import time
from pathlib import Path

from terastack import trace
from terastack.llm.trainer_config import MEMORY_BUDGET_ENV
from terastack.units import parse_bytes

HEADLINE = ["speedup_vs_zero_infinity", "slowdown_vs_in_memory", "slowdown_vs_in_memory_host_resident",
            "io_contention_share", "rss_vs_zero_infinity", "prediction_error", "small_budget_rss_within_budget",
            "ablation_no_active_offload", "ablation_all_recompute", "ablation_all_swap"]

PRESETS = {
    "smoke": ["--model", "tiny-llama", "--seq-len", "64", "--batch-size", "2", "--steps", "2", "--warmup", "1",
              "--systems", "in_memory,terastack,host_resident,small_budget", "--budget-fraction", "1.0"],
    "small": ["--model", "llama-150m", "--seq-len", "128", "--steps", "2", "--warmup", "1"],
    "full": [],
}

#: host_resident's host budget over the training state: the state, plus room for the gradients in flight and the
#: optimizer's read-ahead, so the planner puts nothing on the SSD (tiny models need the margin most)
RESIDENT_FRACTION = 1.25

SYSTEMS = ("in_memory", "terastack", "host_resident", "small_budget", "zero_infinity")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-150m", help="a built-in model name (default llama-150m)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="measured steps per system (after --warmup)")
    p.add_argument("--warmup", type=int, default=2, help="steps before the measured ones (default 2)")
    p.add_argument("--dir", default=None, help="directory on the SSD for stores and ZeRO-Infinity's swap files")
    p.add_argument("--device-budget", default="512MiB",
                   help="terastack's device budget (default 512MiB; on a CPU the device tier is host memory)")
    p.add_argument("--host-fraction", type=float, default=0.25,
                   help="terastack's host budget as a fraction of the training state (default 0.25)")
    p.add_argument("--budget-fraction", type=float, default=0.25,
                   help="small_budget: the memory budget as a fraction of the training state (default 0.25)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    p.add_argument("--no-ablations", action="store_true", help="skip the ablations in the terastack process")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per system before it is stopped")


def _state_bytes(model: str) -> tuple[int, int]:
    from terastack.training.model_registry import resolve_model
    from terastack.training.hf.model_files import build_skeleton

    hf_config, _ = resolve_model(model)
    n = sum(p.numel() for p in build_skeleton(hf_config).parameters())
    return n, 16 * n  # weights + gradients + fp32 master + two moments (fp32 training: master == weights)


def _worker(system: str, args, workdir: Path, extra: list[str], label: str, env: dict | None = None) -> dict:
    out = workdir / f"{label}.json"
    cmd = [sys.executable, "-m", "terastack.llm.bench.bench_worker", "--system", system, "--model", args.model,
           "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--dir", str(workdir), "--out", str(out)] + extra
    print(f"bench llm: {label} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with trace.span(f"run {label}", track="bench"):
        try:
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=args.timeout, env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            return {"error": f"{label} did not finish within {args.timeout:.0f} s"}
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        return {"error": f"{label} failed (exit {proc.returncode}): {tail}"}
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def deepspeed_missing() -> str | None:
    """None if ZeRO-Infinity can run here, else why not."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install deepspeed; apt-get install -y libaio-dev)"
    return None


def measure(args: argparse.Namespace) -> dict:
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise ValueError(f"--systems: unknown {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    params, state = _state_bytes(args.model)
    host_budget = int(state * args.host_fraction)
    device_budget = parse_bytes(args.device_budget, field="--device-budget")
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="terastack-bench-llm-", dir=base))
    from terastack.plan.hardware import save_probe
    from terastack.probe import load_or_measure

    hw = load_or_measure(str(base), quick=True)  # the planner's prediction is made from a probe of this machine
    probe = save_probe(hw, workdir / "probe.json")
    result: dict = {"model": args.model, "parameters": params, "training_state_bytes": state,
                    "seq_len": args.seq_len, "batch_size": args.batch_size, "steps": args.steps,
                    "warmup": args.warmup, "terastack_host_budget_bytes": host_budget,
                    "terastack_device_budget_bytes": device_budget, "dir": str(workdir),
                    "probe": {k: v for k, v in hw.to_dict().items() if k != "versions"}}
    try:
        if "in_memory" in systems:
            result["in_memory"] = _worker("in_memory", args, workdir, [], "in_memory")
        if "terastack" in systems:
            variants = "planned" if args.no_ablations else "planned,no_active_offload,all_recompute,all_swap"
            extra = ["--device-budget", str(device_budget), "--host-budget", str(host_budget),
                     "--variants", variants, "--hardware", str(probe)]
            if trace.tracer.enabled:
                extra += ["--trace", str(workdir / "terastack-trace.json")]
            result["terastack"] = _worker("terastack", args, workdir, extra, "terastack")
            _merge_trace(workdir / "terastack-trace.json")
        if "host_resident" in systems:
            extra = ["--device-budget", str(device_budget), "--host-budget", str(int(state * RESIDENT_FRACTION)),
                     "--hardware", str(probe)]
            result["host_resident"] = _worker("host_resident", args, workdir, extra, "host_resident")
        if "small_budget" in systems:
            budget = int(state * args.budget_fraction)
            # the allocator settings of a memory budget, from the process's start (see terastack.llm.trainer's
            # [Note: a memory budget bounds resident memory])
            r = _worker("terastack", args, workdir, ["--memory-budget", str(budget), "--hardware", str(probe)],
                        "small_budget", env=MEMORY_BUDGET_ENV)
            if "planned" in r:
                r = {**r["planned"], "rss_baseline_bytes": r.get("rss_baseline_bytes")}
            r["memory_budget_bytes"] = budget
            result["small_budget"] = r
        if "zero_infinity" in systems:
            why = deepspeed_missing()
            result["zero_infinity"] = ({"error": why} if why else
                                       _worker("zero_infinity", args, workdir, [], "zero_infinity"))
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    _ratios(result)
    return result


def _merge_trace(path: Path) -> None:
    """The terastack worker's own spans (compute, I/O, optimizer) into this process's trace."""
    if not trace.tracer.enabled or not path.exists():
        return
    spans = [e for e in json.loads(path.read_text()).get("traceEvents", []) if e.get("ph") == "X"]
    if not spans:
        return
    # the worker just finished: its last span ends now
    end = max(e["ts"] + e["dur"] for e in spans)
    now = time.perf_counter()
    for e in spans:
        start = now - (end - e["ts"]) / 1e6
        trace.tracer.interval(e["name"], start, start + e["dur"] / 1e6, track=f"terastack {e.get('cat', '')}",
                              cat=e.get("cat", ""))


def _get(result: dict, *path):
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _ratios(r: dict) -> None:
    ts = _get(r, "terastack", "planned") or {}
    r["terastack_step_s"] = ts.get("step_s")
    r["in_memory_step_s"] = _get(r, "in_memory", "step_s")
    r["zero_infinity_step_s"] = _get(r, "zero_infinity", "step_s")
    r["speedup_vs_zero_infinity"] = _ratio(r["zero_infinity_step_s"], r["terastack_step_s"])
    if r["speedup_vs_zero_infinity"] is None:   # what the report says in its place
        missing = "zero_infinity" if r["zero_infinity_step_s"] is None else "terastack"
        why = (r.get(missing) or {}).get("error") or f"{missing} was not among --systems"
        r.setdefault("why_none", {})["speedup_vs_zero_infinity"] = why
    r["slowdown_vs_in_memory"] = _ratio(r["terastack_step_s"], r["in_memory_step_s"])
    r["terastack_peak_rss_bytes"] = ts.get("peak_rss_bytes")
    r["in_memory_peak_rss_bytes"] = _get(r, "in_memory", "peak_rss_bytes")
    r["zero_infinity_peak_rss_bytes"] = _get(r, "zero_infinity", "peak_rss_bytes")
    r["rss_vs_zero_infinity"] = _ratio(r["terastack_peak_rss_bytes"], r["zero_infinity_peak_rss_bytes"])
    r["predicted_step_s"] = ts.get("predicted_step_s")
    pred = _ratio(r["predicted_step_s"], r["terastack_step_s"])
    r["prediction_error"] = pred - 1 if pred is not None else None
    for system in ("terastack", "zero_infinity", "in_memory"):
        src = ts if system == "terastack" else (r.get(system) or {})
        r[f"{system}_ssd_read_bytes_per_step"] = src.get("ssd_read_bytes_per_step")
        r[f"{system}_ssd_write_bytes_per_step"] = src.get("ssd_write_bytes_per_step")
    _host_resident_ratios(r)
    for name in ("no_active_offload", "all_recompute", "all_swap"):
        r[f"ablation_{name}"] = _ratio(_get(r, "terastack", name, "step_s"), r["terastack_step_s"])
    sb = r.get("small_budget") or {}
    r["small_budget_memory_bytes"] = sb.get("memory_budget_bytes")
    r["small_budget_state_over_budget"] = _ratio(r.get("training_state_bytes"), sb.get("memory_budget_bytes"))
    r["small_budget_peak_rss_bytes"] = sb.get("peak_rss_bytes")
    r["small_budget_step_s"] = sb.get("step_s")
    r["small_budget_rss_within_budget"] = (sb["peak_rss_bytes"] <= sb["memory_budget_bytes"]
                                           if "peak_rss_bytes" in sb else None)
    errors = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
    if errors:
        r["errors"] = errors


def _host_resident_ratios(r: dict) -> None:
    """The host-resident pair, and how much of the quarter budget's slowdown the SSD's traffic explains."""
    hr_ts, hr_im = _get(r, "host_resident", "terastack", "step_s"), _get(r, "host_resident", "in_memory", "step_s")
    r["host_resident_step_s"], r["host_resident_in_memory_step_s"] = hr_ts, hr_im
    r["slowdown_vs_in_memory_host_resident"] = _ratio(hr_ts, hr_im)
    # the steps alternate on the same batches: the median of the pairs' ratios is robust to a machine whose speed
    # drifts over the run, and the CPU-time ratio to time other tenants take (see _measure_alternating)
    pairs = [_ratio(t, i) for t, i in zip(_get(r, "host_resident", "terastack", "step_times_s") or [],
                                          _get(r, "host_resident", "in_memory", "step_times_s") or [])]
    r["host_resident_paired_ratio_median"] = statistics.median(pairs) if pairs and None not in pairs else None
    r["host_resident_cpu_ratio"] = _ratio(_get(r, "host_resident", "terastack", "cpu_s"),
                                          _get(r, "host_resident", "in_memory", "cpu_s"))
    ssd = [_get(r, "host_resident", "terastack", f"ssd_{d}_bytes_per_step") for d in ("read", "write")]
    r["host_resident_ssd_bytes_per_step"] = sum(ssd) if None not in ssd else None
    store = [_get(r, "host_resident", "terastack", f"store_{d}_bytes_per_step") for d in ("read", "write")]
    r["host_resident_store_bytes_per_step"] = sum(store) if None not in store else None
    # quarter budget: compute slowed by k per GB/s of SSD traffic (the planner's model, terastack.plan.llm_planner)
    k = _get(r, "probe", "cpu_io_slowdown_per_gbps")
    ts_step, im_step = r.get("terastack_step_s"), r.get("in_memory_step_s")
    moved = [r.get(f"terastack_ssd_{d}_bytes_per_step") for d in ("read", "write")]
    gbps = sum(moved) / ts_step / 1e9 if ts_step and None not in moved else None
    r["terastack_ssd_gb_per_s"] = gbps
    r["io_contention_s"] = k * gbps * im_step if None not in (k, gbps, im_step) else None
    gap = ts_step - im_step if None not in (ts_step, im_step) else None
    r["io_contention_share"] = _ratio(r["io_contention_s"], gap) if gap and gap > 0 else None
