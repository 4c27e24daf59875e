"""``terastack bench gnn``: out-of-core training vs in-memory features (pipelined and serial), an np.memmap
baseline and synchronous gathering.

[Note: the GNN benchmark]
One run, one generated R-MAT graph whose feature file is at least 4x the memory
budget given to the feature cache (``--budget``, default a quarter of the
feature file; on a machine without an accelerator both cache tiers are host
memory and the budget covers both). Every contender trains the same model
(same initial weights) on the same sampled batches (same sampler, same seeds),
so features are bit-identical wherever they come from and the loss curves must
be identical, not merely close:

  in_memory_pipelined  all features (and the topology) in RAM, fed through the same
              pipeline as terastack (same sampler, threads, batch shapes, prefetch
              depth): the strongest in-memory baseline, and the headline's
  in_memory   all features in RAM; the plain PyG loop: sample, index, train (the
              serial baseline, reported beside the pipelined one)
  terastack   unified static cache + SSD misses, pipeline (sample k+2 | gather k+1 | train k)
  sync        same cache and the same one-pread_many-per-batch gathering, no overlap (the CAM comparison)
  mmap        features in an np.memmap, page cache held to the same budget
              (see [Note: the mmap baseline's memory budget]); the plain loop

``slowdown_vs_in_memory_pipelined`` (terastack epoch / in-memory pipelined
epoch) is the headline: only the feature source differs between the two.
``slowdown_vs_in_memory_serial`` compares with the plain loop; the older key
``slowdown_vs_in_memory`` is the same serial figure, kept for compatibility.

The page cache of the feature file is dropped before every epoch; terastack
reads with O_DIRECT (``io`` in the result says if the file system refused).
Epoch times are compared epoch by epoch (warm-up done before any timing).

[Note: checking the TPC model]
The model predicts the terastack epoch at three cache sizes; each prediction
is compared with the mean of ``--tpc-rounds`` measured epochs at that size, the
sizes taking turns (``prediction_error``). Its inputs are measured, never fitted
to the epochs it predicts: the hit-rate curve from pre-sampling (scored out of
sample), the SSD's IOPS, bandwidth and kernel CPU time per block on the
feature file itself, the gather's CPU cost per row from a replay on synthetic
data, and the training step from 12 timed steps on sampled batches (what
``terastack gnn advise`` does) taken at the start of every round, so that it
sees the machine in the same state as the epochs it predicts. The prediction
from the in-memory run's step time (measured minutes earlier) is reported
beside it: on a shared machine the two windows can differ by 50%.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from terastack.gnn.advise import calibrate_compute, feature_file_hardware, probe_feature_file, workload
from terastack.gnn.bench.plain_loop import bench_model, on_model, plain_epoch
from terastack.gnn.bench.workers import bench_dir, generate_or_replace
from terastack.gnn.graph_placement import Placement
from terastack.gnn.sampling.fanouts import accept_negative_lists, parse_fanouts
from terastack.gnn.sampling.hotness import presample
from terastack.gnn.sampling.pipeline import Pipeline
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.storage.gen import GraphGenerator
from terastack.gnn.training.models import train_step
from terastack.gnn.training.train import evaluate, train_epoch, training_threads
from terastack.memory import peak_rss
from terastack.plan.hardware import Hardware
from terastack.plan.tpc import predict_epoch
from terastack.units import format_bytes, parse_bytes

HEADLINE = ["slowdown_vs_in_memory_pipelined", "slowdown_vs_in_memory_serial", "speedup_vs_mmap", "speedup_vs_sync_gather",
            "speedup_vs_sync_gather_smallest_cache", "prediction_error",
            "accuracy_diff_points", "loss_curves_identical", "feature_to_budget_ratio",
            # --scale and --hetero
            "tpc_error", "tpc_prediction_error", "train_nodes", "seeds_per_s", "peak_rss_bytes"]

PRESETS = {
    "smoke": ["--nodes", "20000", "--feat-dim", "64", "--train-nodes", "1024", "--test-nodes", "512",
              "--batch-size", "256", "--fanouts", "5,5", "--hidden", "32", "--epochs", "1",
              "--disk-probe-seconds", "0.3", "--quiet"],
    "small": ["--nodes", "1000000", "--train-nodes", "16384", "--epochs", "1"],
    "full": [],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None, help="where the generated dataset lives (kept and reused when its "
                   "parameters match; default: $TERASTACK_CACHE/bench-gnn or ~/.cache/terastack/bench-gnn)")
    p.add_argument("--fresh", action="store_true", help="regenerate the dataset even if a matching one exists")
    p.add_argument("--nodes", type=int, default=None, help="default 4M (with --scale: 48M)")
    p.add_argument("--avg-degree", type=float, default=None, help="default 10 (with --scale: 15)")
    p.add_argument("--feat-dim", type=int, default=None, help="feature width (default 128; with --hetero: 1024, "
                   "IGBH's, for every node type)")
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--train-nodes", type=int, default=None,
                   help="training seeds per epoch (default 65536; with --scale: 1%% of the nodes; with --hetero: "
                        "65536 papers)")
    p.add_argument("--test-nodes", type=int, default=4096, help="test nodes evaluated after training")
    p.add_argument("--model", default="sage", choices=["sage", "gcn", "gat"])
    p.add_argument("--hidden", type=int, default=128)
    accept_negative_lists(p)
    p.add_argument("--fanouts", default=None, help="neighbours sampled per hop (default "
                   "15,10; with --hetero: 10,5 for every relation, or per relation as `terastack gnn train` takes them)")
    p.add_argument("--batch-size", type=int, default=None, help="default 1024 (with --scale: 512)")
    p.add_argument("--epochs", type=int, default=2, help="epochs of the in-memory and terastack runs")
    p.add_argument("--baseline-epochs", type=int, default=1, help="epochs of the mmap and sync-gather runs")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", default=None, help="memory for the feature cache, all tiers together "
                   "(default: a quarter of the feature file; with --scale: 1GiB for hot lists and rows together)")
    p.add_argument("--device-share", type=float, default=0.25, help="share of the budget in the device tier")
    p.add_argument("--tpc-fractions", default="0.25,0.5,1",
                   help="cache sizes (fractions of the budget) at which TPC predictions are checked")
    p.add_argument("--tpc-rounds", type=int, default=2, help="measured epochs per TPC cache size (taking turns)")
    p.add_argument("--gen-memory", default=None, help="memory budget of dataset generation (default 1GiB; "
                   "with --scale: 3GiB)")
    p.add_argument("--topology", default="memory", choices=["memory", "ssd"],
                   help="the terastack and sync-gather contenders' topology: in memory, or on the SSD with hot "
                        "lists cached out of the budget (the in-memory baselines keep theirs in memory)")
    p.add_argument("--indptr", default="auto", choices=["auto", "memory", "ssd"],
                   help="with the topology on the SSD: where indptr lives (see terastack gnn train --indptr)")
    p.add_argument("--scale", action="store_true",
                   help="instead: one epoch of GraphSAGE on a generated graph larger than RAM, topology and "
                        "features on the SSD, peak RSS reported (see terastack.gnn.bench.scale)")
    p.add_argument("--rss-limit", default="8GiB", help="with --scale or --hetero: stop a contender whose RSS "
                   "passes this")
    p.add_argument("--cleanup", action="store_true", help="with --scale: delete the dataset after the run")
    p.add_argument("--samplers", type=int, default=0, help="with --scale: sampler threads of terastack's pipeline "
                   "(0: the trainer's default, 2 with the topology on the SSD; see terastack gnn train --samplers)")
    p.add_argument("--presample-nodes", type=int, default=None, help="with --scale or --hetero: the training "
                   "seeds pre-sampled to place the caches (a random sample; default 32768)")
    p.add_argument("--holdout-nodes", type=int, default=None, help="with --scale or --hetero: training seeds, "
                   "disjoint from the pre-sampled ones, sampled with the caches in place to measure the TPC "
                   "model's inputs (default 8192)")
    p.add_argument("--disk-probe-seconds", type=float, default=1.5, help="how long the random reads of the feature "
                   "file's disk probe run (the TPC model's IOPS and the kernel's CPU per read; with --scale once "
                   "before the epoch and once after it)")
    p.add_argument("--load-probe-seconds", type=float, default=8.0, help="with --scale or --hetero: how long each round of the TPC "
                   "model's calibration runs: the SSD's rate while the training steps run, then the step beside reads "
                   "at the predicted epoch's rate (see terastack.gnn.advise measure_under_epoch_load)")
    p.add_argument("--mmap-warmup-batches", type=int, default=32, help="with --scale or --hetero: batches the "
                   "np.memmap contender runs before the batches it is compared on")
    p.add_argument("--mmap-batches", type=int, default=96, help="with --scale or --hetero: batches on which the "
                   "np.memmap contender is compared (its epoch is extrapolated from them)")
    p.add_argument("--mmap-threads", default="1,32", help="with --scale or --hetero: the gathering threads of each "
                   "np.memmap contender, comma-separated (1: the pipeline's own thread; k: k faults in flight, as "
                   "k loader workers give); speedup_vs_mmap is against the fastest")
    p.add_argument("--hetero", action="store_true",
                   help="instead: an IGBH-shaped heterogeneous graph trained out of core vs in-memory features and "
                        "topology and vs np.memmap, each in its own process (see terastack.gnn.bench.hetero)")
    p.add_argument("--papers", type=int, default=None, help="with --hetero: paper nodes (default 250000; "
                   "authors 1.9x, fos 0.19x, institutes 0.015x)")
    p.add_argument("--hetero-model", default="sage", choices=["sage", "rgcn"], help="with --hetero: the model")
    p.add_argument("--keep", action="store_true", help="with --hetero: keep the generated dataset (default: "
                   "deleted after the run)")
    p.add_argument("--threads", type=int, default=-1,
                   help="torch intra-op threads for every contender (-1: one less than the cores, leaving one "
                        "for the pipeline's sampling and gathering threads; 0: torch's default, one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


#: defaults of the flags whose default differs with --scale (terastack.gnn.bench.scale.SCALE_DEFAULTS)
_DEFAULTS = {"nodes": 4_000_000, "avg_degree": 10.0, "train_nodes": 65536, "batch_size": 1024, "gen_memory": "1GiB"}


def measure(args: argparse.Namespace) -> dict:
    """One ``terastack bench gnn`` run (``--scale`` and ``--hetero`` are their own modules); see the Notes above."""
    if args.fanouts is None and not args.hetero:
        args.fanouts = "15,10"
    if args.feat_dim is None:
        args.feat_dim = 1024 if args.hetero else 128
    if args.scale and args.hetero:
        raise ValueError("scale, hetero: choose one of --scale and --hetero")
    if args.threads < -1:
        raise ValueError(f"threads: must be -1 (auto), 0 (torch default) or a count, got {args.threads}")
    if args.scale:
        from terastack.gnn.bench.scale import measure_scale

        return measure_scale(args)
    if args.hetero:
        from terastack.gnn.bench.hetero import measure_hetero

        return measure_hetero(args)
    _settle(args)
    fanouts = parse_fanouts(args.fanouts)
    root = bench_dir(args, "bench-gnn")
    if args.fresh and root.exists():
        shutil.rmtree(root)
    gen, gen_seconds = _generate(args, root)
    ds = open_dataset(root)
    budget = parse_bytes(args.budget, field="budget") if args.budget else ds.feature_bytes // 4
    if budget * 4 > ds.feature_bytes:
        raise ValueError(f"budget: {format_bytes(budget)} is more than a quarter of the "
                         f"{format_bytes(ds.feature_bytes)} feature file; the benchmark is out-of-core only below that")
    if not 0 <= args.device_share <= 1:
        raise ValueError(f"device_share: must be in [0, 1], got {args.device_share}")
    _warm_up(args, ds)
    run = _contest(args, ds, root, fanouts, budget)
    check = _tpc_check(args, ds, run["hot"], budget, fanouts, run["results"]["in_memory"])
    return _summary(args, ds, run, check, fanouts, budget, dataset={
        "dir": str(root), "generation": gen["status"], "generation_seconds": gen_seconds})


def _settle(args: argparse.Namespace) -> None:
    """The defaults that depend on other flags, and the checks of the flags."""
    for name, default in _DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.train_nodes < 1 or args.train_nodes + args.test_nodes > args.nodes:
        raise ValueError(f"train_nodes, test_nodes: must be >= 1 and fit in {args.nodes} nodes")
    if args.threads:
        torch.set_num_threads(training_threads(args.threads))
    if args.tpc_rounds < 1:
        raise ValueError(f"tpc_rounds: must be >= 1, got {args.tpc_rounds}")
    if not 1 <= args.baseline_epochs <= args.epochs:
        raise ValueError(f"baseline_epochs: must be in 1..epochs ({args.epochs}), got {args.baseline_epochs}")


def _generate(args: argparse.Namespace, root: Path) -> tuple[dict, float]:
    """The benchmark's dataset (kept between runs; regenerated when its parameters changed) and the seconds."""
    t0 = time.perf_counter()
    gen = generate_or_replace(GraphGenerator, dict(
        out=str(root), nodes=args.nodes, avg_degree=args.avg_degree, feat_dim=args.feat_dim, classes=args.classes,
        dtype=args.dtype, seed=args.seed, train_fraction=args.train_nodes / args.nodes, val_fraction=0.0,
        test_fraction=args.test_nodes / args.nodes, memory_budget=args.gen_memory, progress=not args.quiet))
    return gen, time.perf_counter() - t0


def _warm_up(args: argparse.Namespace, ds) -> None:
    """The first steps of a process pay one-off costs (allocator, lazy init); none of the timed runs should."""
    from terastack.gnn.sampling.sampler import NeighborSampler

    warm = presample(NeighborSampler(dataset=ds, fanouts=args.fanouts, seed=args.seed),
                     ds.splits["train"][: args.batch_size * 2], args.batch_size, epochs=1, seed=args.seed + 1)[ds.target]
    model, opt = bench_model(args, ds)
    for b in warm.examples[:2]:
        train_step(model, opt, on_model(model, b.to_data(torch.randn(b.num_nodes, ds.feat_dim),
                                                          torch.zeros(b.num_nodes, dtype=torch.long))))


def _placed(args: argparse.Namespace, ds, total: int, topology: str | None = None, **fields) -> Placement:
    """The terastack contender's placement call: ``total`` bytes of cache, ``--device-share`` of them in the device
    tier, the topology as ``--topology`` says (opened here when on the SSD: the same batches, lists read per hop)."""
    dev, topology = int(total * args.device_share), topology or args.topology
    return Placement(ds if topology == "memory" else ds.root, fanouts=args.fanouts, seed=args.seed,
                     batch_size=args.batch_size, device_cache=dev, host_cache=total - dev, topology=topology,
                     indptr=args.indptr, **fields)


def _contest(args: argparse.Namespace, ds, root: Path, fanouts, budget: int) -> dict:
    """Every contender's epochs and accuracy, each with its own model (same initial weights) and feature source,
    each placed by the one placement call (the baselines with their own feature source).

    The in-memory (serial and pipelined), terastack and sync epochs run round-robin (epoch 0 of each, then
    epoch 1 of each) so that interference from other work on the machine falls on all of them alike."""
    train_ids, test_ids = ds.splits["train"], ds.splits["test"]
    common = dict(batch_size=args.batch_size, progress=not args.quiet)
    mem = Placement(ds, fanouts=args.fanouts, seed=args.seed, batch_size=args.batch_size, features="memory")
    load_seconds = mem.setup_seconds["cache_fill"]
    ts = _placed(args, ds, budget, keep_examples=8)
    sampler, features = mem.sampler, mem.features.sources[ds.target]
    # The pipelined in-memory contender differs from terastack's only in its feature source.
    pipes = {"in_memory_pipelined": mem.pipeline, "terastack": ts.pipeline,
             "sync": Pipeline(ts.sampler, ts.features, ds.labels, overlap=False)}
    sources = {"in_memory": features}
    labels_ = {"in_memory": "in-memory serial", "in_memory_pipelined": "in-memory pipelined",
               "terastack": "terastack", "sync": "sync gather", "mmap": "mmap"}
    planned = {"in_memory": args.epochs, "in_memory_pipelined": args.epochs, "terastack": args.epochs,
               "sync": args.baseline_epochs, "mmap": args.baseline_epochs}
    models = {name: bench_model(args, ds) for name in planned}
    results: dict[str, list[dict]] = {name: [] for name in planned}

    def run(name: str, epoch: int) -> None:
        model, opt = models[name]
        if name in pipes:
            r = train_epoch(pipes[name], model, opt, train_ids, epoch=epoch, label=labels_[name], **common)
        else:
            r = plain_epoch(sampler, sources[name], ds.labels, model, opt, train_ids, epoch=epoch,
                             label=labels_[name], **common)
        results[name].append(r)

    for epoch in range(args.epochs):
        for name in ("in_memory", "in_memory_pipelined", "terastack", "sync"):
            if epoch < planned[name]:
                run(name, epoch)
    acc = {name: evaluate(Pipeline(sampler, features, ds.labels, overlap=False) if name == "in_memory" else pipes[name],
                          models[name][0], test_ids, batch_size=args.batch_size)
           for name in ("in_memory", "in_memory_pipelined")}
    # The mmap runs come after the in-memory copy is freed: its page cache (up to the budget) is mapped
    # into this process, and both together would double-count memory the benchmark is meant to bound.
    del features, sources["in_memory"], pipes["in_memory_pipelined"]
    mem.close()
    mm = Placement(ds, fanouts=args.fanouts, seed=args.seed, batch_size=args.batch_size, features="mmap",
                   host_cache=budget)
    sources["mmap"] = mm.features.sources[ds.target]
    for epoch in range(planned["mmap"]):
        run("mmap", epoch)
    acc["terastack"] = evaluate(pipes["terastack"], models["terastack"][0], test_ids, batch_size=args.batch_size)
    cache_info, topology_info = ts.describe()
    cache = ts.features.sources[ds.target]
    evicted = sources["mmap"].evicted_pages
    ts.close()
    mm.close()
    sources.clear()  # the models and sources go; run() above still names the dicts
    models.clear()
    return {"results": results, "accuracy": acc, "hot": ts.hot, "cache_info": cache_info, "topology": topology_info,
            "cached_rows": cache.device_rows + cache.host_rows, "evicted_pages": evicted,
            "slot_bytes": sum(pipes["terastack"].last_stats.slot_bytes), "device_cache": int(budget * args.device_share),
            "setup_seconds": {"in_memory_load": load_seconds, "presample": ts.setup_seconds["presample"],
                              "cache_fill": ts.setup_seconds["cache_fill"]}}


def _tpc_check(args: argparse.Namespace, ds, hot, budget: int, fanouts, mem_epochs: list[dict]) -> dict:
    """The TPC model vs measured epochs at several cache sizes. [Note: checking the TPC model] explains the inputs."""
    train_ids = ds.splits["train"]
    common = dict(batch_size=args.batch_size, progress=not args.quiet)
    ssd = probe_feature_file(ds, seconds=args.disk_probe_seconds)
    here = feature_file_hardware(ssd)
    wl = workload(ds, hot, batch_size=args.batch_size, model=args.model, hidden=args.hidden, layers=len(fanouts),
                  calibrate=False, io_cpu_seconds_per_block=ssd["io_cpu_seconds_per_block"])
    fractions = [float(f) for f in args.tpc_fractions.split(",")]
    caches = [_placed(args, ds, int(budget * f), "memory", hotness={ds.target: hot}) for f in fractions]
    measured: list[list[dict]] = [[] for _ in fractions]
    steps: list[float] = []
    small_sync: list[dict] = []  # the CAM comparison where the SSD has the most to do: the smallest cache
    for rnd in range(args.tpc_rounds):  # the cache sizes take turns, so noise falls on all of them alike
        steps.append(calibrate_compute(args.model, hot, ds, hidden=args.hidden, layers=len(fanouts), steps=12)[0])
        for i, (frac, c) in enumerate(zip(fractions, caches)):
            model, opt = bench_model(args, ds)
            measured[i].append(train_epoch(c.pipeline, model, opt, train_ids, epoch=0,
                                           label=f"terastack {frac:g}x budget (round {rnd})", **common))
            if i == 0:
                model, opt = bench_model(args, ds)
                small_sync.append(train_epoch(Pipeline(c.sampler, c.features, ds.labels, overlap=False), model, opt,
                                              train_ids, epoch=0, label=f"sync gather {frac:g}x budget", **common))
    wl_run = dataclasses.replace(wl, compute_seconds=float(np.mean(steps)))
    mem_batches = sum(len(e["losses"]) for e in mem_epochs)
    wl_mem = dataclasses.replace(
        wl, compute_seconds=sum(e["seconds"] - e["sample_seconds"] - e["gather_seconds"] for e in mem_epochs)
        / mem_batches)
    tpc = [_tpc_row(args, here, wl_run, wl_mem, int(budget * frac), runs, wl.compute_threads)
           for frac, runs in zip(fractions, measured)]
    for c in caches:
        c.close()
    calibration = {"step_seconds_per_round": steps, "step_seconds_from_in_memory_run": wl_mem.compute_seconds,
                   "io_cpu_seconds_per_block": wl.io_cpu_seconds_per_block,
                   "gather_seconds_per_row": wl.gather_seconds_per_row,
                   "miss_cpu_seconds_per_row": wl.miss_cpu_seconds_per_row}
    return {"tpc": tpc, "calibration": calibration, "small_sync": small_sync, "ssd": ssd}


def _tpc_row(args: argparse.Namespace, here: Hardware, wl_run, wl_mem, total: int, runs: list[dict],
             threads: int) -> dict:
    """One cache size: the predicted epoch (step calibrated two ways) against the measured rounds."""
    dev = int(total * args.device_share)
    split = dict(device_cache=dev, host_cache=total - dev, train_threads=threads)
    pred = predict_epoch(wl_run, here, **split)
    alt = predict_epoch(wl_mem, here, **split)
    seconds = float(np.mean([r["seconds"] for r in runs]))
    return {"cache_bytes": total, "predicted_epoch_seconds": pred.epoch_seconds,
            "measured_epoch_seconds": seconds, "measured_rounds": [r["seconds"] for r in runs],
            "prediction_error": abs(pred.epoch_seconds - seconds) / seconds,
            "predicted_with_in_memory_step": alt.epoch_seconds,
            "prediction_error_in_memory_step": abs(alt.epoch_seconds - seconds) / seconds,
            "predicted_hit_rate": pred.hit_rate,
            "measured_hit_rate": float(np.mean([r["device_hit_rate"] + r["host_hit_rate"] for r in runs])),
            "bottleneck": pred.bottleneck, "stages_seconds_per_batch": pred.stages,
            "ssd_rate_source": pred.ssd_rate_source}


def _speeds(run: dict, check: dict) -> dict:
    """terastack's epoch time against each contender's, and whether every loss curve is the same."""
    r = run["results"]
    mem_epochs, pipe_epochs, ts_epochs, sync_epochs, mm_epochs = (
        r[k] for k in ("in_memory", "in_memory_pipelined", "terastack", "sync", "mmap"))
    mem_t, pipe_t, ts_t = ([e["seconds"] for e in r[k]] for k in ("in_memory", "in_memory_pipelined", "terastack"))
    paired = lambda other: float(np.mean([e["seconds"] for e in other]) / np.mean(ts_t[: len(other)]))
    mem_losses = [l for e in mem_epochs for l in e["losses"]]
    ts_losses = [l for e in ts_epochs for l in e["losses"]]
    identical = (ts_losses == mem_losses and all(e["losses"] == mem_epochs[e["epoch"]]["losses"]
                                                 for e in pipe_epochs + sync_epochs + mm_epochs))
    serial = float(np.mean(ts_t) / np.mean(mem_t))
    tpc = check["tpc"]
    return {
        "slowdown_vs_in_memory_pipelined": float(np.mean(ts_t) / np.mean(pipe_t)),
        "slowdown_vs_in_memory_serial": serial,
        "slowdown_vs_in_memory": serial,  # the serial figure under its older name, kept for compatibility
        "speedup_vs_mmap": paired(mm_epochs),
        "speedup_vs_sync_gather": paired(sync_epochs),
        "speedup_vs_sync_gather_smallest_cache": float(np.mean([e["seconds"] for e in check["small_sync"]])
                                                       / np.mean(tpc[0]["measured_rounds"])),
        "prediction_error": [round(t["prediction_error"], 4) for t in tpc],
        # the TPC model's error (absolute) as --scale and --hetero report it (the last round's: calibrated on the
        # most epochs)
        "tpc_prediction_error": tpc[-1]["prediction_error"] if tpc else None,
        "tpc_error": abs(tpc[-1]["prediction_error"]) if tpc else None,
        "loss_curves_identical": identical,
        "max_loss_diff": max(abs(a - b) for a, b in zip(ts_losses, mem_losses)) if mem_losses else 0.0,
        "final_loss": ts_losses[-1] if ts_losses else None,
        "in_memory_pipelined_epoch_seconds": pipe_t, "in_memory_epoch_seconds": mem_t,
        "terastack_epoch_seconds": ts_t,
        "sync_gather_epoch_seconds": [e["seconds"] for e in sync_epochs],
        "mmap_epoch_seconds": [e["seconds"] for e in mm_epochs],
    }


def _summary(args: argparse.Namespace, ds, run: dict, check: dict, fanouts, budget: int, *, dataset: dict) -> dict:
    train_ids, test_ids = ds.splits["train"], ds.splits["test"]
    ts_epochs, sync_epochs = run["results"]["terastack"], run["results"]["sync"]
    acc, cache_info, topology_info, hot = run["accuracy"], run["cache_info"], run["topology"], run["hot"]
    speeds = _speeds(run, check)
    return {
        **speeds,
        "train_nodes": len(train_ids), "seeds_per_s": len(train_ids) / float(np.mean(speeds["terastack_epoch_seconds"])),
        "peak_rss_bytes": peak_rss(),
        "accuracy_diff_points": 100 * abs(acc["terastack"] - acc["in_memory"]),
        "feature_to_budget_ratio": ds.feature_bytes / budget,
        "in_memory_accuracy": acc["in_memory"], "in_memory_pipelined_accuracy": acc["in_memory_pipelined"],
        "terastack_accuracy": acc["terastack"],
        "hit_rates": {"device": ts_epochs[0]["device_hit_rate"], "host": ts_epochs[0]["host_hit_rate"],
                      "miss": ts_epochs[0]["miss_rate"], "topology": ts_epochs[0]["topology_hit_rate"],
                      "predicted_from_presampling": hot.hit_rate(run["cached_rows"])},
        "ssd": {"GBps_per_epoch": [e["ssd_GBps"] for e in ts_epochs],
                "bytes_per_epoch": [e["ssd_bytes"] for e in ts_epochs],
                "calls_per_batch": ts_epochs[0]["ssd_calls_per_batch"], "io": cache_info["io"],
                "measured_on_feature_file": check["ssd"]},
        "terastack_epochs": [{k: v for k, v in e.items() if k != "losses"} for e in ts_epochs],
        "sync_gather_epochs": [{k: v for k, v in e.items() if k != "losses"} for e in sync_epochs],
        "mmap": {"budget_bytes": budget, "evicted_pages": run["evicted_pages"]},
        "tpc": check["tpc"], "tpc_calibration": check["calibration"],
        "cache": cache_info,
        "topology": topology_info,
        "memory_bytes": {"in_memory_features": ds.feature_bytes,
                         "terastack_cache": cache_info["device_bytes"] + cache_info["host_bytes"]
                         + cache_info["table_bytes"] + topology_info.get("memory_bytes", 0),
                         "terastack_staging": cache_info["staging_bytes"] + run["slot_bytes"],
                         "process_peak_rss": peak_rss()},
        "dataset": {"dir": dataset["dir"], "nodes": ds.num_nodes, "edges": ds.num_edges, "feat_dim": ds.feat_dim,
                    "feat_dtype": ds.feat_dtype.name, "feature_bytes": ds.feature_bytes,
                    "train_nodes": len(train_ids), "test_nodes": len(test_ids), "generation": dataset["generation"],
                    "generation_seconds": dataset["generation_seconds"]},
        "budget_bytes": budget, "device_cache_bytes": run["device_cache"],
        "setup_seconds": run["setup_seconds"],
        "presample": {"batches": hot.batches, "nodes_per_batch": hot.nodes_per_batch,
                      "sample_seconds_per_batch": hot.sample_seconds_per_batch},
        "config": {"model": args.model, "hidden": args.hidden, "fanouts": list(fanouts), "batch_size": args.batch_size,
                   "epochs": args.epochs, "lr": args.lr, "seed": args.seed, "torch_threads": torch.get_num_threads()},
    }
