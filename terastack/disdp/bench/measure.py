"""``terastack bench dist``: the disaggregated job vs PyTorch FSDP2 and a serial ZeRO-3 schedule, in one run.

Same model, same data, same seeds, same number of workers. For each system:
``step_s`` (median steady step, slowest worker), ``exposed_comm_fraction``
(time the training thread waits on communication / step time; see [Note: exposed
communication] in terastack.disdp.job_stats for the worker it is taken from),
``worker_state_bytes`` (what a worker process holds between steps beyond
its model, however it holds it: [Note: state a worker holds] in terastack.disdp.held_state) and the max abs difference of the final
parameters from single-process AdamW. Then the parameter servers' ingress per
step for 1, 2 and 4 workers, with and without the aggregator; the runs without
it are also read as one server's throughput as the workers grow (``ps_scaling``,
see :mod:`terastack.disdp.bench.ps`).

With ``--model NAME`` (a built-in model such as ``llama-550m``, a model directory or a config.json) or
``--systems`` it measures instead the job on that model against FSDP2 and ZeRO-3, each system under an RSS
watchdog (:mod:`terastack.disdp.bench.on_model`): step time, exposed communication, summed peak RSS and whether it
fits. ``--model toy`` / ``tiny-llama`` without ``--systems`` are the mechanism benchmark's own small models.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from terastack.disdp.bench import on_model as bench_models
from terastack.disdp.bench.ps import ps_scaling
from terastack.disdp.server_state import load_parameters
from terastack.disdp.train_config import TrainConfig
from terastack.disdp.launch import JOB_MODULE, launch_local
from terastack.disdp.reference import max_abs_diff, train_single_process
from terastack.disdp.workload import BUILTIN

HEADLINE = ["speedup_vs_strongest_baseline", "strongest_baseline", "speedup_vs_fsdp2", "speedup_vs_zero3",
            "exposed_comm_fraction_ratio_vs_fsdp2", "terastack_exposed_comm_fraction",
            "fsdp2_exposed_comm_fraction", "zero3_exposed_comm_fraction", "worker_state_bytes",
            "max_abs_diff_vs_single_process", "server_ingress_flat_with_aggregator",
            "ps_scaling_efficiency"] + bench_models.HEADLINE

_MODEL = ["--model", "tiny-llama", "--heads", "4", "--vocab", "512", "--seq-len", "64"]
PRESETS = {
    "smoke": ["--model", "toy", "--dim", "16", "--layers", "2", "--vocab", "32", "--seq-len", "8", "--micro-batch",
              "2", "--steps", "3", "--ingress-workers", "1,2", "--ingress-steps", "2", "--repeats", "1"],
    "small": _MODEL + ["--dim", "128", "--layers", "4", "--micro-batch", "4", "--steps", "6"],
    "full": _MODEL + ["--dim", "256", "--layers", "4", "--micro-batch", "8", "--steps", "10"],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), help="sizes: smoke (seconds), small, full (the default)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--model", help="a built-in model (llama-550m, llama-1.1b, ...; see terastack.training."
                   "model_registry), a model directory or a config.json: terastack, FSDP2 and ZeRO-3 on it under the "
                   "RSS watchdog; or toy / tiny-llama (the default), the mechanism benchmark's models sized by --dim")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq-len", type=int, help="tokens per row (default 64; 128 with --model)")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, help="timed steps (default 10; 3 with --model)")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="rounds of the three systems (figures: fastest round)")
    p.add_argument("--ingress-workers", default="1,2,4", help="worker counts for the server-ingress measurement "
                   "('': none, the systems' comparison alone)")
    p.add_argument("--ingress-steps", type=int, default=2)
    p.add_argument("--run-dir", help="where the jobs run (default: a temporary directory)")
    p.add_argument("--timeout", type=float, help="bound on every wait of a rank, seconds (default 120; 1200 with "
                   "--model)")
    bench_models.add_arguments(p)


def _apply_preset(args: argparse.Namespace) -> None:
    if not args.preset:
        return
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    preset = parser.parse_args(PRESETS[args.preset])
    for key, value in vars(preset).items():
        if key != "preset":
            setattr(args, key, value)


def _fill(args: argparse.Namespace, **defaults) -> None:
    """The defaults of the options whose default depends on the kind of run."""
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def on_model(args: argparse.Namespace) -> bool:
    """Whether this run compares the systems on a model (``--model NAME`` or ``--systems``) rather than measuring
    the mechanism on a toy model."""
    return bool(args.systems) or args.model not in (None, *BUILTIN)


def measure(args: argparse.Namespace) -> dict:
    if on_model(args):
        if args.preset:
            raise ValueError("--preset sizes the mechanism benchmark; with --model or --systems give the model, "
                             "--steps, --batch-size and --seq-len instead")
        _fill(args, seq_len=128, steps=3, timeout=1200.0)
        return bench_models.measure(args)
    _apply_preset(args)
    _fill(args, model="tiny-llama", seq_len=64, steps=10, timeout=120.0)
    with tempfile.TemporaryDirectory(prefix="terastack-bench-dist-") as tmp:
        root = Path(args.run_dir or tmp)
        common = job_settings(args)
        result, main_run = _compare_systems(args, root, common)
        if args.ingress_workers:
            result.update(_ingress_sweep(args, root, common, main_run))
        result["note"] = ("all systems share this machine's cores: the disaggregated job runs its workers, agent "
                          "threads, aggregator and servers on the same CPUs that FSDP2 uses for its workers alone")
    return result


def job_settings(args: argparse.Namespace) -> dict:
    """The settings every job of the mechanism benchmark shares (its model, rows and bounds)."""
    return dict(model=args.model, dim=args.dim, layers=args.layers, heads=args.heads, vocab=args.vocab,
                seq_len=args.seq_len, micro_batch=args.micro_batch, timeout_s=args.timeout, progress=False)


def _compare_systems(args, root: Path, common: dict) -> tuple[dict, dict]:
    """terastack, FSDP2 and ZeRO-3 on the same job, ``repeats`` rounds in turn; the figures and terastack's
    fastest run."""
    # With --trace, every rank of the terastack job also writes its own Chrome trace beside it.
    rank_traces = str(Path(args.trace).with_suffix("")) + "-ranks" if getattr(args, "trace", None) else ""
    main = TrainConfig(**common, workers=args.workers, servers=args.servers, steps=args.steps,
                       prefetch=args.prefetch, run_dir=str(root / "terastack"), trace_dir=rank_traces, census=True)
    rows = main.micro_batch * main.workers
    # [Note: fp32 noise floor] in terastack.disdp.reference: the check is against single-process AdamW
    # with the global batch as W accumulated micro-batches; the one-backward reference is reported too.
    ref, _ = train_single_process(main.model_spec(), steps=main.steps, seed=main.seed, rows=rows, lr=main.lr,
                                  micro_batches=main.workers)
    ref_full, _ = train_single_process(main.model_spec(), steps=main.steps, seed=main.seed, rows=rows,
                                       lr=main.lr)
    result: dict = {"workers": args.workers, "servers": args.servers, "model": args.model,
                    "parameters": sum(t.numel() for t in ref.values()), "steps": args.steps}
    systems = {
        "terastack": (main, JOB_MODULE, None),
        "fsdp2": (TrainConfig(**(main.to_dict() | {"run_dir": str(root / "fsdp2"), "trace_dir": ""})),
                  "terastack.disdp.fsdp2", args.workers),
        "zero3": (TrainConfig(**(main.to_dict() | {"run_dir": str(root / "zero3"), "trace_dir": ""})),
                  "terastack.disdp.zero3", args.workers),
    }
    # Systems run one after another, `repeats` rounds in turn, so that load from anything else on the
    # machine falls on all of them alike; each system's figures come from its fastest round.
    best: dict[str, tuple[dict, float]] = {}
    for _ in range(args.repeats):
        for name, (cfg, module, world) in systems.items():
            t0 = time.perf_counter()
            out = launch_local(cfg, quiet=True, module=module, world_size=world)
            params, _ = load_parameters(cfg.checkpoint_dir)
            out["max_abs_diff"] = max_abs_diff(params, ref)
            out["max_abs_diff_vs_one_backward"] = max_abs_diff(params, ref_full)
            if name not in best or out["step_s"] < best[name][0]["step_s"]:
                best[name] = (out, time.perf_counter() - t0)
    for name, (out, wall) in best.items():
        for key in ("step_s", "exposed_comm_fraction", "exposed_comm_fraction_incl_imbalance", "max_abs_diff",
                    "max_abs_diff_vs_one_backward"):
            result[f"{name}_{key}"] = out[key]
        result[f"{name}_worker_state_bytes"] = out["worker_state_bytes"]
        result[f"{name}_worker_held_state"] = out["worker_held_state"]
        result[f"{name}_wall_s"] = wall
        if name == "terastack":
            result["terastack_server_update_s"] = out.get("server_update_s")
            result["worker_peak_param_bytes"] = out.get("worker_peak_param_bytes")
            result["model_param_bytes"] = out.get("model_param_bytes")
    result["step_s"] = {k: result[f"{k}_step_s"] for k in systems}
    result["exposed_comm_fraction"] = {k: result[f"{k}_exposed_comm_fraction"] for k in systems}
    result["speedup_vs_fsdp2"] = result["fsdp2_step_s"] / result["terastack_step_s"]
    result["speedup_vs_zero3"] = result["zero3_step_s"] / result["terastack_step_s"]
    # the strongest baseline is whichever of the two stepped faster in this run
    result["strongest_baseline"] = min(("fsdp2", "zero3"), key=lambda k: result[f"{k}_step_s"])
    result["speedup_vs_strongest_baseline"] = (result[f"{result['strongest_baseline']}_step_s"]
                                               / result["terastack_step_s"])
    result["exposed_comm_fraction_ratio_vs_fsdp2"] = (result["terastack_exposed_comm_fraction"]
                                                      / max(result["fsdp2_exposed_comm_fraction"], 1e-12))
    result["worker_state_bytes"] = result["terastack_worker_state_bytes"]
    result["max_abs_diff_vs_single_process"] = result["terastack_max_abs_diff"]
    result["reference_accumulated_vs_one_backward"] = max_abs_diff(ref, ref_full)
    result["correct_within_1e-5"] = all(result[f"{k}_max_abs_diff"] <= 1e-5 for k in systems)
    return result, best["terastack"][0]


def _ingress_sweep(args, root: Path, common: dict, main_run: dict) -> dict:
    """The servers' ingress per step as workers grow, with and without the aggregator; the runs without it read
    as the server's throughput as the workers grow (terastack.disdp.bench.ps). ``main_run``: a run of
    ``args.workers`` with the aggregator (terastack's run of the comparison), taken for that configuration."""
    ingress: dict = {"with_aggregator": {}, "without_aggregator": {}}
    single_server_runs: dict[int, dict] = {}
    for w in (int(x) for x in args.ingress_workers.split(",")):
        for agg in (True, False):
            if agg and w == args.workers:   # the main run is this configuration
                ingress["with_aggregator"][str(w)] = main_run["server_ingress_bytes_per_step"]
                continue
            cfg = TrainConfig(**common, workers=w, servers=args.servers, aggregator=agg, steps=args.ingress_steps,
                              run_dir=str(root / f"ingress-w{w}-{'agg' if agg else 'noagg'}"))
            out = launch_local(cfg, quiet=True)
            ingress["with_aggregator" if agg else "without_aggregator"][str(w)] = out["server_ingress_bytes_per_step"]
            if not agg:
                single_server_runs[w] = out
    flat = list(ingress["with_aggregator"].values())
    grows = list(ingress["without_aggregator"].values())
    scaling = ps_scaling(single_server_runs, servers=args.servers, cores=len(os.sched_getaffinity(0)))
    return {"server_ingress_bytes_per_step": ingress, "server_ingress_flat_with_aggregator": len(set(flat)) == 1,
            "server_ingress_grows_without_aggregator": all(b > a for a, b in zip(grows, grows[1:])),
            "ps_scaling": scaling, "ps_scaling_efficiency": scaling["efficiency_at_largest"]}
