"""``terastack bench gnn --scale``: one epoch of GraphSAGE, trained as a user trains, on a generated graph
larger than this machine's RAM, topology and features on the SSD, the process's peak RSS read from /proc;
the same batches through ``np.memmap`` features and topology in the same run.

[Note: the scale run]
The dataset's size is computed before anything is written: features
``N * F * itemsize``, topology ``(N + 1) * 8 + E * 4`` with ``E = 2 * round(N * d / 2)``
(each R-MAT pair is stored both ways; duplicates and self-loops dropped later
only make it smaller), labels and splits. It is printed beside MemTotal; only
a dataset larger than MemTotal is called a scale run (``scale_run``), and a
smaller one (the smoke test's) says so instead of claiming it. Before
generating, the free disk must hold the dataset plus the generator's scratch
(8 bytes per edge of bucket files), or the run is refused naming both.

Generation runs as a child process (the generator of ``terastack gnn gen``:
resumable, with progress), so its peak RSS is its own (``generation.peak_rss_bytes``, from
``getrusage(RUSAGE_CHILDREN)``) and the training process's peak (``VmHWM`` of
/proc/self/status; no children run while it trains) is the training's alone.
A watchdog thread samples the RSS and stops the run with a message when it
passes ``--rss-limit``, so the kernel's OOM killer never decides the result.

Seeds: users train on the labelled share of the nodes (about 1% on
ogbn-papers100M), so the epoch runs over ``--train-nodes`` seeds, by default
1% of the nodes. The caches are placed from pre-sampling a random sample of
them (``--presample-nodes``), not all: the epoch then touches rows and lists
the pre-sampling never saw, as a user's does. A second, disjoint sample
(``--holdout-nodes``) is sampled once the hot lists are cached: it measures
what the TPC model needs out of sample -- the hit-rate curve of the feature
ranking, the sampler's CPU time per batch and the 4 KiB blocks it reads for
the lists the cache misses (the model's topology term, terastack.plan.tpc).
The SSD's random-read rate the model takes is measured while the training
steps run, and the step beside reads at the rate the model predicts the epoch
reads at (``--load-probe-seconds`` a round; terastack.gnn.advise [Note: the step
measured beside the epoch's own read rate]), as they run in the epoch; the
disk's rate alone is reported beside (``tpc.ssd``).

Training: the topology is opened on the SSD (``indptr`` by the ``auto`` rule
of terastack.gnn.storage.topology), the one cache budget (``--budget``) is split between
hot lists and feature rows (terastack.gnn.storage.budget_split [Note: splitting one budget between topology and
features]), and one epoch over every training seed runs through the pipeline
(``epoch_seconds``: the whole epoch, measured, not extrapolated). SSD bytes are
the storage engine's own count over the epoch.

The ``np.memmap`` contenders (terastack.gnn.bench.workers.GraphContender: features held to the same budget, see
terastack.gnn.storage.cache [Note: the mmap baseline's memory budget]; topology mapped,
its page cache left to the kernel, which favours them) run the same pipeline
in child processes after the terastack caches are freed
(terastack.gnn.bench.workers [Note: contenders in child processes]), one per
count of gathering threads in ``--mmap-threads`` (terastack.gnn.bench.workers
[Note: the np.memmap baselines]). Each runs the first
``--mmap-warmup-batches + --mmap-batches`` batches of the same epoch and
``speedup_vs_mmap`` compares terastack with the fastest of them on the same
window of batches ([Note: comparing the same batches]); the mmap epoch is
extrapolated from that window and labelled so (a whole mmap epoch over 1% of
48M nodes would take hours). Their losses must equal terastack's on those
batches. The same window is then run with the training step left out, by
terastack (in this process, after its epoch) and by every mmap contender:
``loader_speedup_vs_mmap``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from terastack.bench_watchdog import RssWatchdog
from terastack.gnn.advise import (miss_blocks, predict_under_load, out_of_sample_curve, probe_feature_file,
                                  profile_sampling, rank_positions, sample_seed_sets, training_steps, workload)
from terastack.gnn.bench.workers import Contender, fork_server_ready, measure_window, mmap_name, parse_mmap_threads, run_epoch, skip_step, start_fork_server, window_seconds
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.storage.manifest import MANIFEST
from terastack.gnn.training.models import GNN
from terastack.gnn.sampling.pipeline import resolve_samplers
from terastack.gnn.sampling.fanouts import parse_fanouts
from terastack.gnn.graph_placement import Placement
from terastack.gnn.training.train import train_epoch, training_threads
from terastack.io import get_engine
from terastack.memory import mem_total, peak_rss
from terastack.units import format_bytes, parse_bytes

#: defaults of a scale run: ~48M nodes x 15 x 128 fp32 = 24.6 GB of features + ~3.3 GB of topology; training
#: seeds: 1% of the nodes ("train_fraction"), the caches placed from a sample of 32,768 of them
SCALE_DEFAULTS = {"nodes": 48_000_000, "avg_degree": 15.0, "train_fraction": 0.01, "batch_size": 512,
                  "budget": "1GiB", "gen_memory": "3GiB", "presample_nodes": 32768, "holdout_nodes": 8192}
RSS_TARGET = 4 << 30


def default_train_nodes(nodes: int) -> int:
    """At least 1% of the nodes (the labelled share users train on)."""
    return max(1, -(-nodes // 100))


def dataset_bytes(nodes: int, avg_degree: float, feat_dim: int, itemsize: int, train_nodes: int) -> dict:
    """Bytes of the dataset the scale run generates, by part, and the generator's scratch; see [Note: the scale run]."""
    edges = 2 * max(1, int(round(nodes * avg_degree / 2)))
    index = 4 if nodes < 2**31 else 8
    parts = {"features": nodes * feat_dim * itemsize, "topology": (nodes + 1) * 8 + edges * index,
             "labels": nodes * 4, "splits": train_nodes * 8}
    return {**parts, "total": sum(parts.values()), "scratch": edges * 2 * index, "edges_at_most": edges}


def disk_bytes(root: Path) -> int:
    """Bytes the files under ``root`` hold on the disk: their allocated blocks (a sparse file counts only what it
    holds)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def _generate(args, root: Path, nodes: int, avg_degree: float, train_nodes: int, gen_memory: str) -> dict:
    """``terastack gnn gen`` in a child process; returns its JSON result plus its peak RSS."""
    config = dict(out=str(root), nodes=nodes, avg_degree=avg_degree, feat_dim=args.feat_dim, classes=args.classes,
                  dtype=args.dtype, seed=args.seed, train_fraction=train_nodes / nodes, val_fraction=0.0,
                  test_fraction=0.0, memory_budget=gen_memory, progress=not args.quiet, force=bool(args.fresh))
    # What `terastack gnn gen` runs, without building the whole command line (imports only the generator).
    child = ("import json, sys; from terastack.gnn.storage.gen import GraphGenerator; "
             "print(json.dumps(GraphGenerator(GraphGenerator.Config(**json.loads(sys.argv[1]))).run()))")
    cmd = [sys.executable, "-c", child, json.dumps(config)]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the child imports this same terastack
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    started = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"dataset generation in {root} failed (exit {proc.returncode}); rerun the same command "
                           "to resume it")
    result = json.loads(proc.stdout)
    result["wall_seconds"] = time.perf_counter() - started
    # ru_maxrss of children is in KiB on Linux: the largest child, i.e. the generator
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return result


def measure_scale(args) -> dict:
    nodes = args.nodes or SCALE_DEFAULTS["nodes"]
    avg_degree = args.avg_degree or SCALE_DEFAULTS["avg_degree"]
    train_nodes = args.train_nodes or default_train_nodes(nodes)
    batch_size = args.batch_size or SCALE_DEFAULTS["batch_size"]
    budget = parse_bytes(args.budget or SCALE_DEFAULTS["budget"], field="budget")
    gen_memory = args.gen_memory or SCALE_DEFAULTS["gen_memory"]
    rss_limit = parse_bytes(args.rss_limit, field="rss_limit")
    fanouts = parse_fanouts(args.fanouts)
    presample_nodes = args.presample_nodes or SCALE_DEFAULTS["presample_nodes"]
    holdout_nodes = args.holdout_nodes or SCALE_DEFAULTS["holdout_nodes"]
    mmap_threads = parse_mmap_threads(args.mmap_threads)
    if not 1 <= train_nodes <= nodes:
        raise ValueError(f"train_nodes: must be in 1..nodes ({nodes}), got {train_nodes}")
    if presample_nodes < 1 or holdout_nodes < 1:
        raise ValueError(f"presample_nodes, holdout_nodes: must be >= 1, got {presample_nodes}, {holdout_nodes}")
    itemsize = np.dtype(args.dtype).itemsize
    sizes = dataset_bytes(nodes, avg_degree, args.feat_dim, itemsize, train_nodes)
    ram = mem_total()
    exceeds = sizes["total"] > ram
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    say(f"scale run: {nodes} nodes, average degree {avg_degree:g}, {args.feat_dim} x {args.dtype} features: "
        f"features {format_bytes(sizes['features'])} + topology {format_bytes(sizes['topology'])} + labels/splits "
        f"= {format_bytes(sizes['total'])} vs MemTotal {format_bytes(ram)}; {train_nodes} training seeds")
    if not exceeds:
        print(f"terastack bench gnn --scale: the dataset ({format_bytes(sizes['total'])}) fits in RAM "
              f"({format_bytes(ram)}): not a scale run, the 'larger than RAM' claim is skipped", file=sys.stderr)

    root = _scale_root(args, sizes)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        start_fork_server()   # the mmap contenders' fork server imports while the dataset is made
        gen = _generate(args, root, nodes, avg_degree, train_nodes, gen_memory)
        say(f"dataset {gen['status']} in {gen['wall_seconds']:.1f} s, generator peak RSS "
            f"{format_bytes(gen['peak_rss_bytes'])}")
        fork_server_ready()   # and is done before terastack's epoch is timed
        if args.threads:
            torch.set_num_threads(training_threads(args.threads))
        ours = _terastack_epoch(args, root, fanouts=fanouts, budget=budget, batch_size=batch_size,
                                train_nodes=train_nodes, presample_nodes=presample_nodes,
                                holdout_nodes=holdout_nodes, rss_limit=rss_limit)
        peak = peak_rss()  # the training's: no child ran in this process's lifetime but the generator
        mmap = _mmap_epoch(args, root, ours, fanouts=fanouts, budget=budget, batch_size=batch_size,
                           rss_limit=rss_limit, say=say, mmap_threads=mmap_threads)
        disk = disk_bytes(root)   # the graph the epochs trained on, as it lies on the disk
    finally:
        if args.cleanup:
            shutil.rmtree(root, ignore_errors=True)
    return _scale_report(args, ours, mmap, gen, sizes, peak=peak, ram=ram, disk=disk, exceeds=exceeds, root=root,
                         nodes=nodes, avg_degree=avg_degree, fanouts=fanouts, batch_size=batch_size, budget=budget,
                         gen_memory=gen_memory, rss_limit=rss_limit, presample_nodes=presample_nodes,
                         holdout_nodes=holdout_nodes, mmap_threads=mmap_threads)


def _scale_root(args, sizes: dict) -> Path:
    """The scale dataset's directory, once the disk is known to hold what is still to be written."""
    root = Path(args.dir) if args.dir else Path(os.environ.get("TERASTACK_CACHE") or os.path.expanduser(
        "~/.cache/terastack")) / "bench-gnn-scale"
    complete = (root / MANIFEST).is_file() and not args.fresh
    existing = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0
    needed = 0 if complete else max(0, sizes["total"] + sizes["scratch"] - existing)
    probe_dir = root if root.exists() else next(p for p in [root, *root.parents] if p.exists())
    free = shutil.disk_usage(probe_dir).free
    if needed > free:
        raise ValueError(f"disk: the scale dataset needs {needed} bytes ({format_bytes(needed)}: "
                         f"{format_bytes(sizes['total'])} of dataset + {format_bytes(sizes['scratch'])} of "
                         f"generation scratch) in {root}, and {free} bytes ({format_bytes(free)}) are free")
    return root


def _scale_report(args, ours: dict, mmap: dict, gen: dict, sizes: dict, *, peak: int, ram: int, disk: int,
                  exceeds: bool,
                  root: Path, nodes: int, avg_degree: float, fanouts, batch_size: int, budget: int, gen_memory,
                  rss_limit: int, presample_nodes: int, holdout_nodes: int, mmap_threads: list[int]) -> dict:
    epoch, predicted = ours["epoch"], ours["predicted"]
    error = abs(predicted.epoch_seconds - epoch["seconds"]) / epoch["seconds"]
    return {
        "scale_run": exceeds,
        "exceeds_ram": exceeds,
        "dataset_bytes": sizes["total"], "mem_total_bytes": ram, "dataset_to_ram_ratio": sizes["total"] / ram,
        # measured: the blocks the dataset's files hold on the disk after the run, against RAM and the training's
        # own peak RSS
        "dataset_disk_bytes": disk, "dataset_disk_to_ram": disk / ram, "dataset_disk_to_peak_rss": disk / peak,
        "train_nodes": ours["train_nodes"], "train_fraction": ours["train_nodes"] / nodes,
        "epoch_seconds": epoch["seconds"], "epoch_measured": "whole epoch (every training seed)",
        "seeds_per_s": ours["train_nodes"] / epoch["seconds"],
        "speedup_vs_mmap": mmap["speedup"],
        "speedup_vs_mmap_by_threads": mmap["by_threads"],
        "loader_speedup_vs_mmap": mmap["loader_speedup"],
        "loader_speedup_vs_mmap_by_threads": mmap["loader_by_threads"],
        "peak_rss_bytes": peak, "peak_rss_within_4GiB": peak <= RSS_TARGET,
        "tpc_predicted_epoch_seconds": predicted.epoch_seconds, "tpc_prediction_error": error,
        "ssd_bytes_read": ours["ssd_bytes_read"],
        "feature_hit_rate": epoch["device_hit_rate"] + epoch["host_hit_rate"],
        "topology_hit_rate": epoch["topology_hit_rate"],
        "batches": epoch["batches"], "loss_mean": epoch["loss_mean"],
        "feature_ssd_bytes": epoch["ssd_bytes"], "topology_ssd_bytes": epoch["topology_ssd_bytes"],
        "topology_calls_per_batch": epoch["topology_calls_per_batch"],
        "ssd_requests": ours["ssd_requests"],
        "mmap": mmap["report"],
        "rss": {"peak_bytes": peak, "max_sampled_bytes": ours["max_sampled_rss"], "limit_bytes": rss_limit,
                "measured": "VmHWM of /proc/self/status (the mmap contender runs in a child process afterwards)",
                "mmap_contender_peak_bytes": mmap["report"]["peak_rss_bytes"]},
        "sizes": sizes,
        "budget_bytes": budget, "split": ours["split"], "cache": ours["cache"], "topology": ours["topology"],
        "tpc": {"bottleneck": predicted.bottleneck, "predicted_hit_rate": predicted.hit_rate,
                "predicted_topology_blocks_per_batch": ours["workload"].topology_blocks_per_batch,
                "stages_seconds_per_batch": predicted.stages, "ssd": ours["ssd"],
                # the rate the reads were priced at beside the rate the epoch's reads averaged (at most the disk's:
                # an epoch above the priced rate had a faster disk than the model was given)
                "ssd_read_rate": {**(predicted.ssd_rate.to_dict() if predicted.ssd_rate else {}),
                                  "epoch_bytes_per_s": ours["ssd_bytes_read"] / max(epoch["seconds"], 1e-12)},
                "ssd_while_training": ours["ssd_while_training"],
                "ssd_after_epoch": ours["ssd_after_epoch"], "holdout": ours["holdout"],
                "note": "inputs measured on pre-sampled and hold-out batches (never the epoch); the SSD's random-"
                        "read rate measured while the steps run, the step's time beside reads at the predicted "
                        "epoch's rate (ssd_while_training: full_rate, at_epoch_rate; ssd: the disk alone); "
                        "topology reads: the hold-out's list blocks at that rate"},
        "epoch": {k: v for k, v in epoch.items() if k not in ("losses", "marks")},
        "presample_seconds": ours["presample_seconds"], "presample": ours["presample"],
        "generation": {"status": gen["status"], "seconds": gen["wall_seconds"],
                       "peak_rss_bytes": gen["peak_rss_bytes"], "memory_budget": gen_memory},
        "dataset": {"dir": str(root), "nodes": nodes, "edges": gen.get("edges"), "avg_degree": avg_degree,
                    "feat_dim": args.feat_dim, "feat_dtype": args.dtype, "deleted_after_run": bool(args.cleanup)},
        "config": {"model": "sage", "hidden": args.hidden, "fanouts": list(fanouts), "batch_size": batch_size,
                   "lr": args.lr, "seed": args.seed, "indptr": args.indptr, "torch_threads": torch.get_num_threads(),
                   "samplers": ours["samplers"],
                   "presample_nodes": presample_nodes, "holdout_nodes": holdout_nodes, "mmap_threads": mmap_threads},
    }


def _terastack_epoch(args, root: Path, *, fanouts, budget: int, batch_size: int, train_nodes: int,
                     presample_nodes: int, holdout_nodes: int, rss_limit: int) -> dict:
    """Place the dataset (pre-sample, split the budget, measure the model's inputs on the hold-out with the lists
    in place, predict, fill the rows), then train one epoch."""
    engine = get_engine()
    with RssWatchdog(RssWatchdog.Config(limit_bytes=rss_limit, interval_s=0.2, include_self=True, on_exceed="exit",
                                        label="terastack bench gnn --scale")) as watchdog:
        t0 = time.perf_counter()
        ds = open_dataset(root, topology="ssd", indptr=args.indptr, topology_budget=budget)
        train_ids = ds.splits["train"][:train_nodes]
        placed_from, holdout = sample_seed_sets(train_ids, presample_nodes, holdout_nodes, seed=args.seed)
        ssd = probe_feature_file(ds, seconds=args.disk_probe_seconds)
        inputs: dict = {"ssd": ssd, "holdout": holdout, "train_ids": train_ids, "placed_from": placed_from}
        opened = time.perf_counter() - t0
        # one pass: the hold-out, not a pre-sampled epoch, scores the placement; the counts go before the rows
        # are cached (order matters for the peak: no whole-graph temporary beside the cache)
        placed = Placement(ds, fanouts=fanouts, seed=args.seed, batch_size=batch_size, presample_epochs=1,
                           host_cache=budget, device="cpu", samplers=getattr(args, "samplers", 0) or 0,
                           seeds=placed_from, keep_hotness=False, engine=engine,
                           after_split=lambda p: inputs.update(_model_inputs(args, p, inputs, fanouts=fanouts,
                                                                             batch_size=batch_size, engine=engine)))
        cache = placed.features.sources[ds.target]
        inputs["presample"]["expected_feature_hit_rate"] = inputs["workload"].hit_rate(cache.device_rows
                                                                                       + cache.host_rows)
        run = _train_one_epoch(args, placed, train_ids, batch_size=batch_size, engine=engine)
        ds.close()
    return {"epoch": run["epoch"], "loader_marks": run["loader_marks"], "predicted": inputs["predicted"],
            "workload": inputs["workload"], "train_ids": train_ids, "samplers": placed.pipeline.config.samplers,
            "train_nodes": len(train_ids), "split": placed.split.info, "cache": run["cache"],
            "topology": run["topology"], "ssd": ssd, "ssd_while_training": inputs["loaded"],
            "ssd_after_epoch": run["ssd_after"], "holdout": {**inputs["profile"], "seeds": len(holdout)},
            "presample": inputs["presample"],
            "presample_seconds": opened + placed.setup_seconds["open"] + placed.setup_seconds["presample"],
            "ssd_bytes_read": run["ssd_bytes_read"], "ssd_requests": run["ssd_requests"],
            "max_sampled_rss": watchdog.max_sampled}


def _model_inputs(args, placed: Placement, inputs: dict, *, fanouts, batch_size: int, engine) -> dict:
    """The TPC model's inputs, measured out of sample on the hold-out with the hot lists in place (before the rows
    are cached), and its prediction; see [Note: the scale run]."""
    ds, hot, ssd, train_ids = placed.dataset, placed.hot, inputs["ssd"], inputs["train_ids"]
    prof = profile_sampling(placed.sampler, inputs["holdout"], batch_size, seed=args.seed)
    positions = rank_positions(hot.order(), ds.num_nodes)
    curve = out_of_sample_curve(positions, prof.pop("ids")[ds.target])
    per_batch = prof.pop("ids_per_batch")[ds.target]
    host = placed.split.budgets[ds.target][1]  # the rows the feature cache will hold (the rule of UnifiedCache)
    cached_rows = max(0, host - ds.num_nodes * (4 if ds.num_nodes < 2**31 else 8)) // ds.row_bytes
    _, missed, blocks = miss_blocks(positions, per_batch, cached_rows, ds.row_bytes)
    prof["feature_blocks_per_missed_row"] = blocks / max(missed, 1)
    del positions, per_batch
    wl = workload(ds, hot, batch_size=batch_size, model="sage", hidden=args.hidden, layers=len(fanouts),
                  calibrate=True, calibration_steps=5, io_cpu_seconds_per_block=ssd["io_cpu_seconds_per_block"],
                  curve=curve)
    rows = prof["rows_per_batch"][ds.target]  # the hold-out's batches, not the pre-sampled ones, set the shape
    apart_per_batch = wl.compute_seconds * rows / max(hot.nodes_per_batch, 1e-9)
    wl = dataclasses.replace(wl, batches_per_epoch=-(-len(train_ids) // batch_size), nodes_per_batch=rows,
                             sample_seconds=prof["sample_cpu_seconds_per_batch"],
                             topology_blocks_per_batch=prof["topology_blocks_per_batch"],
                             blocks_per_miss=prof["feature_blocks_per_missed_row"] or wl.blocks_per_miss)
    samplers = resolve_samplers(getattr(args, "samplers", 0) or 0, placed.sampler.topology)
    # the rate and the step the model takes, measured under the epoch's own load; the figures apart are kept
    steps = training_steps("sage", hot.examples, ds, hidden=args.hidden, layers=len(fanouts), seed=args.seed)
    predicted, loaded = predict_under_load(wl, ssd, ds, steps, rows=rows, host_cache=host, seconds=args.load_probe_seconds,
                                           seed=args.seed, where="the feature file, beside the steps", engine=engine,
                                           samplers=samplers, queue_depth=engine.config.queue_depth)
    loaded["compute_seconds_per_batch_apart"] = apart_per_batch
    return {"profile": prof, "predicted": predicted, "loaded": loaded,
            "workload": dataclasses.replace(wl, compute_seconds=loaded["compute_seconds_per_batch"]),
            "presample": {"batches": hot.batches, "nodes_per_batch": hot.nodes_per_batch,
                          "seeds": len(inputs["placed_from"])}}


def _train_one_epoch(args, placed: Placement, train_ids, *, batch_size: int, engine) -> dict:
    """One epoch over every training seed through the pipeline, the loader alone over the mmap window, and the
    disk's rates after it; closes the caches."""
    ds = placed.dataset
    torch.manual_seed(args.seed)
    model = GNN("sage", ds.feat_dim, args.hidden, ds.num_classes, placed.sampler.hops)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    before = engine.stats.snapshot()
    epoch = train_epoch(placed.pipeline, model, opt, train_ids, batch_size=batch_size, epoch=0,
                        progress=not args.quiet, label="scale")
    after = engine.stats.snapshot()
    # the mmap contenders' window again, the training step left out (bench_workers [Note: the np.memmap baselines])
    first, count = measure_window(epoch["batches"], args.mmap_warmup_batches, args.mmap_batches)
    loader = run_epoch(placed.pipeline, model, opt, train_ids, batch_size=batch_size, epoch=0, step=skip_step,
                       limit=first + count)
    cache_info, topology_info = placed.describe()
    placed.close()
    # the disk's rates again after the epoch: how far they moved while the prediction's inputs held still
    ssd_after = probe_feature_file(ds, seconds=args.disk_probe_seconds)
    return {"epoch": epoch, "loader_marks": loader["marks"], "cache": cache_info,
            "topology": topology_info, "ssd_after": ssd_after, "ssd_bytes_read": after["bytes_read"] - before["bytes_read"],
            "ssd_requests": after["requests"] - before["requests"]}


def _mmap_epoch(args, root: Path, ours: dict, *, fanouts, budget: int, batch_size: int, rss_limit: int, say,
                mmap_threads: list[int]) -> dict:
    """The same first batches of the epoch through np.memmap, in a child process per count of gathering threads,
    trained and then with the step left out; see [Note: the scale run]."""
    total = ours["epoch"]["batches"]
    first, count = measure_window(total, args.mmap_warmup_batches, args.mmap_batches)
    ts_marks = ours["epoch"]["marks"]
    mine, mine_loader = window_seconds(ts_marks, first, count), window_seconds(ours["loader_marks"], first, count)
    runs = {}
    for k in mmap_threads:
        say(f"np.memmap contender, {k} gathering thread(s): batches 0..{first + count - 1} of {total} (compared on "
            f"{first}..{first + count - 1}), trained and then the loader alone")
        config = dict(kind="mmap", root=str(root), model="sage", fanouts=list(fanouts), seed=args.seed,
                      batch_size=batch_size, budget=budget, hidden=args.hidden, lr=args.lr,
                      threads=torch.get_num_threads(), mmap_threads=k, train_nodes=len(ours["train_ids"]))
        with Contender(mmap_name(k), "terastack.gnn.bench.workers:GraphContender", config, rss_limit=rss_limit) as mm:
            r = mm.call("run", epoch=0, limit=first + count)
            loader = mm.call("run", epoch=0, limit=first + count, train=False)
        theirs = window_seconds(r["marks"], first, count)
        runs[k] = {"batches_run": r["batches"], "window_seconds": theirs,
                   "loader_window_seconds": window_seconds(loader["marks"], first, count),
                   "epoch_seconds_extrapolated": theirs / count * total,
                   "losses_identical": r["losses"] == ours["epoch"]["losses"][: len(r["losses"])],
                   "evicted_pages": r["evicted_pages"], "gather_seconds_per_batch": r["gather_seconds"]
                   / max(r["batches"], 1), "stall_seconds": r["stall_seconds"],
                   "peak_rss_bytes": max(r["peak_rss_bytes"], loader["peak_rss_bytes"])}
    strongest = min(runs, key=lambda k: runs[k]["window_seconds"])  # bench_workers [Note: the np.memmap baselines]
    loader_strongest = min(runs, key=lambda k: runs[k]["loader_window_seconds"])
    best = runs[strongest]
    report = {"batches_run": best["batches_run"], "window": [first, first + count],
              "window_seconds": best["window_seconds"], "terastack_window_seconds": mine,
              "strongest_threads": strongest, "loader_strongest_threads": loader_strongest,
              "terastack_loader_window_seconds": mine_loader,
              "epoch_seconds_extrapolated": best["epoch_seconds_extrapolated"],
              "epoch_measured": f"batches {first}..{first + count - 1} of {total}, extrapolated to the epoch",
              "losses_identical": all(r["losses_identical"] for r in runs.values()),
              "evicted_pages": best["evicted_pages"], "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs.values()),
              "budget_bytes": budget, "by_threads": {str(k): r for k, r in runs.items()},
              "note": "features held to the budget in every mmap contender; the mapped topology's page cache left to "
                      "the kernel; speedup_vs_mmap is against the fastest contender (--mmap-threads); loader_*: the "
                      "same window with the training step left out"}
    return {"speedup": best["window_seconds"] / mine, "report": report,
            "by_threads": {str(k): r["window_seconds"] / mine for k, r in runs.items()},
            "loader_speedup": runs[loader_strongest]["loader_window_seconds"] / mine_loader,
            "loader_by_threads": {str(k): r["loader_window_seconds"] / mine_loader for k, r in runs.items()}}
