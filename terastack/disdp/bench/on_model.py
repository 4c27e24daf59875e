"""``terastack bench dist --model NAME``: the disaggregated job, FSDP2 and serial ZeRO-3 on a built-in model, each
under an RSS watchdog; what each system's step takes, what of it waits on communication, and whether it fits.

Every system trains the same model from the same initial weights on the same token batches (the same global
batch, the same number of workers; :mod:`terastack.disdp.bench.spec`), one system after the other, each as child
processes of this one (torchrun's elastic agent starts the ranks: the job's workers, servers and aggregator for
terastack, the ranks of the gloo mesh for FSDP2 and ZeRO-3). :class:`~terastack.bench_watchdog.RssWatchdog`
adds up the peak RSS of every one of them and ends a system whose sum passes ``--rss-limit``: that system "does
not fit" (``fits_X`` false), it is not a failure of the benchmark. The first ``--warmup`` steps are not timed.

Exposed communication is taken as the existing ``bench dist`` takes it ([Note: exposed communication] in
terastack.disdp.job_stats): per step, the waits of the worker that waits least. For FSDP2 and ZeRO-3 a worker's
waits are the time its training thread spends in (and waiting on) collectives; for terastack they are the part of
rank 0's whole step (rows sent, every worker's pass, the servers' last update, the figures added up) that is not
the worker's own compute (its pass less the time its hooks waited for parameters).

[Note: the model run's defaults]
The terastack system runs as the issue's memory target reads it, two workers and one server, with the servers'
fp32 weights and moments in the tiered store on the SSD (``--state ssd``) and no aggregator: with two workers
the aggregator saves a server little ingress but is a process of its own holding a gradient bucket per worker
(at a 130M-parameter model it was 1.4 GiB of the 7.3 GiB summed; a step was no slower without it).
``--aggregator`` puts it back; the mechanism benchmark (without ``--model``) measures what it does for ingress.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from terastack.bench_watchdog import RssWatchdog
from terastack.disdp.bench.spec import SYSTEMS, BenchSpec, read_rank_stats
from terastack.units import format_bytes, parse_bytes

#: the program every rank of a benchmark system runs
RANKS_MODULE = "terastack.disdp.bench.ranks"
HEADLINE = ["step_time_ratio_vs_fsdp2", "exposed_comm_ratio_vs_fsdp2", "fits_terastack", "fits_fsdp2", "fits_zero3",
            "peak_rss_bytes_total_terastack", "peak_rss_bytes_total_fsdp2", "peak_rss_bytes_total_zero3"]
DEFAULT_RSS_LIMIT = "20GiB"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options only ``--model`` runs have (the others are shared with the mechanism benchmark)."""
    p.add_argument("--systems", help=f"comma list of {', '.join(SYSTEMS)} (default: all three)")
    p.add_argument("--batch-size", type=int, help="rows of the global batch, split among the workers (with --model; "
                   "default 2 per worker)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones (with --model)")
    p.add_argument("--rss-limit", default=DEFAULT_RSS_LIMIT, help="the most the summed peak RSS of a system's "
                   "processes may reach; past it the system does not fit (with --model)")
    p.add_argument("--state", choices=("ssd", "memory"), default="ssd", help="where terastack's servers keep the "
                   "fp32 weights and AdamW moments (with --model)")
    p.add_argument("--aggregator", action="store_true", help="terastack's workers send their gradients through an "
                   "aggregator (a process of its own) instead of to the servers (with --model; [Note: the model "
                   "run's defaults])")


def wanted_systems(text: str | None) -> list[str]:
    names = [s.strip() for s in (text or ",".join(SYSTEMS)).split(",") if s.strip()]
    bad = [s for s in names if s not in SYSTEMS]
    if bad or not names:
        raise ValueError(f"--systems: {', '.join(bad) or 'none given'}: choose among {', '.join(SYSTEMS)}")
    return [s for s in SYSTEMS if s in names]


def rss_limit(text: str) -> tuple[int, str | None]:
    """The watchdog's limit: ``--rss-limit``, lowered below what the machine has available (a note says so)."""
    limit = parse_bytes(text, field="--rss-limit")
    if limit <= 0:
        raise ValueError(f"--rss-limit: must be > 0, got {text}")
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    margin = 1 << 30
    if available is not None and limit > available - margin:
        lowered = max(available - margin, 1 << 28)
        return lowered, (f"--rss-limit {text} lowered to {format_bytes(lowered)}: the machine has "
                         f"{format_bytes(available)} available, and the kernel's OOM killer must never decide")
    return limit, None


def model_params(name: str) -> int:
    from terastack.training.hf.model_files import build_skeleton
    from terastack.training.model_registry import resolve_model

    return sum(p.numel() for p in build_skeleton(resolve_model(name)[0]).parameters())


def check_disk(root: Path, params: int, systems: list[str], state: str) -> None:
    """Refuse up front a run whose servers' state would not fit on the free disk (bytes needed and free)."""
    if "terastack" not in systems or state != "ssd":
        return
    need = int(params * 12 * 1.1)   # fp32 weights and two AdamW moments, plus the store's padding
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need > free:
        raise ValueError(f"--run-dir {root}: the servers' state needs {format_bytes(need)} on disk, "
                         f"{format_bytes(free)} is free")


def roles_of(spec: BenchSpec):
    from terastack.disdp.roles import RoleMap

    if spec.system == "terastack":
        roles = RoleMap(workers=spec.workers, servers=spec.servers, aggregator=spec.aggregator)
        return roles, roles.world_size
    return RoleMap(workers=spec.workers, servers=1, aggregator=False), spec.workers


def summarize(spec: BenchSpec, stats: list[dict]) -> dict:
    """A system's figures from its ranks' statistics ([Note: exposed communication] in terastack.disdp.job_stats)."""
    workers = sorted((s for s in stats if s.get("role") == "worker"), key=lambda s: s["index"])
    if len(workers) != spec.workers:
        raise ValueError(f"{spec.system}: {len(workers)} of {spec.workers} workers wrote their figures")
    n = spec.total_steps
    if spec.system == "terastack":
        whole = workers[0]["step_s"]   # rank 0's step: synchronous, the same step every worker is in
        steps = [whole[i] for i in range(n)]
        waits = [min(whole[i] - (w["pass_s"][i] - w["wait_s"][i]) for w in workers) for i in range(n)]
        losses = workers[0]["loss"]
    else:
        steps = [max(w["step_s"][i] for w in workers) for i in range(n)]
        waits = [min(w["wait_s"][i] for w in workers) for i in range(n)]
        losses = [statistics.fmean(w["loss"][i] for w in workers) for i in range(n)]
    timed = slice(spec.warmup, None)
    out = {"step_s": statistics.median(steps[timed]), "exposed_comm_s": statistics.median(waits[timed]),
           "exposed_comm_fraction": sum(waits[timed]) / sum(steps[timed]), "losses": losses,
           "worker_optimizer_bytes": max(w.get("optimizer_state_bytes", 0) for w in workers)}
    for key in ("worker_peak_param_bytes", "server_peak_host_state_bytes", "model_param_bytes"):
        if key in workers[0]:
            out[key] = workers[0][key]
    return out


def run_system(spec: BenchSpec, *, limit: int, quiet: bool = True) -> dict:
    """One system under the watchdog: its figures, ``fits`` and its summed peak RSS; its servers' stores deleted
    afterwards whatever happened."""
    from terastack.disdp.launch import JobFailed, launch_ranks

    roles, world = roles_of(spec)
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    path = spec.save()
    failure = None
    t0 = time.perf_counter()
    try:
        with RssWatchdog(RssWatchdog.Config(limit_bytes=limit)) as dog:
            try:
                # cold starts: the watchdog tells the ranks apart by their command lines and environments, which
                # forked ranks share with the process they were forked from
                launch_ranks(roles, RANKS_MODULE, [str(path)], world_size=world, timeout_s=spec.timeout_s,
                             quiet=quiet, warm=False)
            except JobFailed as exc:
                failure = str(exc)
        by_rank: dict[str, int] = {}
        for r, peak in dog.peaks_by_rank():
            who = roles.describe(r) if r is not None and 0 <= r < world else "other processes"
            by_rank[who] = by_rank.get(who, 0) + peak
        out: dict = {"wall_s": time.perf_counter() - t0, "peak_rss_bytes_total": dog.peak_total,
                     "processes": len(dog.peaks), "fits": not dog.exceeded, "peak_rss_bytes_by_rank": by_rank}
        if dog.exceeded:
            out["note"] = (f"stopped by the RSS watchdog: its processes' summed peak RSS passed "
                           f"{format_bytes(limit)}")
        elif failure is not None:
            out["fits"] = None
            out["error"] = failure
        else:
            out |= summarize(spec, read_rank_stats(spec.run_dir))
        return out
    finally:
        for store in Path(spec.run_dir).glob("server-*"):   # the servers' tiered stores (the large files)
            shutil.rmtree(store, ignore_errors=True)


def ratio(a, b):
    return a / b if a is not None and b else None


def measure(args: argparse.Namespace) -> dict:
    systems = wanted_systems(args.systems)
    limit, limit_note = rss_limit(args.rss_limit)
    batch = args.batch_size or 2 * args.workers
    params = model_params(args.model)
    with tempfile.TemporaryDirectory(prefix="terastack-bench-dist-") as tmp:
        root = Path(args.run_dir or tmp)
        check_disk(root, params, systems, args.state)
        result: dict = {"model": args.model, "params": params, "workers": args.workers, "servers": args.servers,
                        "batch_size": batch, "seq_len": args.seq_len, "steps": args.steps, "warmup": args.warmup,
                        "state": args.state, "aggregator": args.aggregator, "systems": systems,
                        "rss_limit_bytes": limit}
        if limit_note:
            result["rss_limit_note"] = limit_note
        for name in SYSTEMS:
            if name not in systems:
                for key in ("step_s", "exposed_comm_s", "exposed_comm_fraction", "peak_rss_bytes_total", "fits",
                            "loss_first"):
                    result[f"{key}_{name}"] = None
                continue
            spec = BenchSpec(system=name, model=args.model, run_dir=str(root / name), workers=args.workers,
                             servers=args.servers, aggregator=args.aggregator, batch_size=batch,
                             seq_len=args.seq_len, steps=args.steps, warmup=args.warmup, state=args.state,
                             prefetch=args.prefetch, timeout_s=args.timeout,
                             trace_dir=str(Path(args.trace).with_suffix("")) + "-ranks"
                             if getattr(args, "trace", None) and name == "terastack" else "")
            out = run_system(spec, limit=limit)
            for key, value in out.items():
                result[f"{key}_{name}"] = value
            for key in ("step_s", "exposed_comm_s", "exposed_comm_fraction"):
                result.setdefault(f"{key}_{name}", None)
            result[f"loss_first_{name}"] = out["losses"][0] if "losses" in out else None
    fsdp2_step, fsdp2_exposed = result["step_s_fsdp2"], result["exposed_comm_fraction_fsdp2"]
    result["step_time_ratio_vs_fsdp2"] = ratio(result["step_s_terastack"], fsdp2_step)
    result["speedup_vs_fsdp2"] = ratio(fsdp2_step, result["step_s_terastack"])
    result["exposed_comm_ratio_vs_fsdp2"] = ratio(result["exposed_comm_fraction_terastack"], fsdp2_exposed)
    result["exposed_comm_s_ratio_vs_fsdp2"] = ratio(result["exposed_comm_s_terastack"], result["exposed_comm_s_fsdp2"])
    result["step_time_ratio_zero3_vs_fsdp2"] = ratio(result["step_s_zero3"], fsdp2_step)
    result["exposed_comm_ratio_zero3_vs_fsdp2"] = ratio(result["exposed_comm_fraction_zero3"], fsdp2_exposed)
    result["note"] = ("ratios are against FSDP2 measured in this run; peak RSS is the sum over every process of the "
                      "system of its own peak (VmHWM), read from /proc")
    return result
