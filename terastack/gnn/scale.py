"""``terastack bench gnn --scale``: one epoch of GraphSAGE on a generated graph larger than this machine's RAM,
topology and features on the SSD, the process's peak RSS read from /proc.

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

Training: the topology is opened on the SSD (``indptr`` by the ``auto`` rule
of terastack.gnn.topology), pre-sampling counts feature gathers and list
expansions, the one cache budget (``--budget``) is split between hot lists and
feature rows ([Note: splitting one budget between topology and features]), and
one epoch over ``--train-nodes`` seeds runs through the pipeline. SSD bytes are
the storage engine's own count over the epoch. The TPC model (terastack.plan.tpc)
predicts the epoch from the feature cache, this SSD (measured on the feature
file) and a calibrated training step; it does not model topology reads, so its
error includes them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from terastack.gnn.advise import probe_feature_file, workload
from terastack.gnn.cache import UnifiedCache
from terastack.gnn.dataset import MANIFEST, open_dataset
from terastack.gnn.hotness import presample
from terastack.gnn.models import GNN
from terastack.gnn.pipeline import Pipeline
from terastack.gnn.sampler import NeighborSampler, parse_fanouts
from terastack.gnn.train import share_budget, train_epoch, training_threads
from terastack.io import get_engine
from terastack.memory import current_rss, mem_total, peak_rss
from terastack.plan.hardware import Hardware
from terastack.plan.tpc import predict_epoch
from terastack.units import format_bytes, parse_bytes

#: defaults of a scale run: ~48M nodes x 15 x 128 fp32 = 24.6 GB of features + ~3.3 GB of topology
SCALE_DEFAULTS = {"nodes": 48_000_000, "avg_degree": 15.0, "train_nodes": 16384, "batch_size": 512,
                  "budget": "1GiB", "gen_memory": "3GiB"}
RSS_TARGET = 4 << 30


def dataset_bytes(nodes: int, avg_degree: float, feat_dim: int, itemsize: int, train_nodes: int) -> dict:
    """Bytes of the dataset the scale run generates, by part, and the generator's scratch; see [Note: the scale run]."""
    edges = 2 * max(1, int(round(nodes * avg_degree / 2)))
    index = 4 if nodes < 2**31 else 8
    parts = {"features": nodes * feat_dim * itemsize, "topology": (nodes + 1) * 8 + edges * index,
             "labels": nodes * 4, "splits": train_nodes * 8}
    return {**parts, "total": sum(parts.values()), "scratch": edges * 2 * index, "edges_at_most": edges}


class RssWatchdog:
    """Samples this process's RSS; past ``limit`` it prints why and exits (before the OOM killer would)."""

    def __init__(self, limit: int, interval: float = 0.2):
        self.limit, self.interval = limit, interval
        self.max_sampled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="terastack-rss-watchdog", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = current_rss()
            self.max_sampled = max(self.max_sampled, rss)
            if rss > self.limit:
                print(f"terastack bench gnn --scale: resident memory {format_bytes(rss)} passed --rss-limit "
                      f"{format_bytes(self.limit)}; stopping", file=sys.stderr, flush=True)
                os._exit(3)

    def __enter__(self) -> "RssWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _generate(args, root: Path, nodes: int, avg_degree: float, train_nodes: int, gen_memory: str) -> dict:
    """``terastack gnn gen`` in a child process; returns its JSON result plus its peak RSS."""
    config = dict(out=str(root), nodes=nodes, avg_degree=avg_degree, feat_dim=args.feat_dim, classes=args.classes,
                  dtype=args.dtype, seed=args.seed, train_fraction=train_nodes / nodes, val_fraction=0.0,
                  test_fraction=0.0, memory_budget=gen_memory, progress=not args.quiet, force=bool(args.fresh))
    # What `terastack gnn gen` runs, without building the whole command line (imports only the generator).
    child = ("import json, sys; from terastack.gnn.gen import GraphGenerator; "
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
    train_nodes = args.train_nodes or SCALE_DEFAULTS["train_nodes"]
    batch_size = args.batch_size or SCALE_DEFAULTS["batch_size"]
    budget = parse_bytes(args.budget or SCALE_DEFAULTS["budget"], field="budget")
    gen_memory = args.gen_memory or SCALE_DEFAULTS["gen_memory"]
    rss_limit = parse_bytes(args.rss_limit, field="rss_limit")
    fanouts = parse_fanouts(args.fanouts)
    if not 1 <= train_nodes <= nodes:
        raise ValueError(f"train_nodes: must be in 1..nodes ({nodes}), got {train_nodes}")
    itemsize = np.dtype(args.dtype).itemsize
    sizes = dataset_bytes(nodes, avg_degree, args.feat_dim, itemsize, train_nodes)
    ram = mem_total()
    exceeds = sizes["total"] > ram
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    say(f"scale run: {nodes} nodes, average degree {avg_degree:g}, {args.feat_dim} x {args.dtype} features: "
        f"features {format_bytes(sizes['features'])} + topology {format_bytes(sizes['topology'])} + labels/splits "
        f"= {format_bytes(sizes['total'])} vs MemTotal {format_bytes(ram)}")
    if not exceeds:
        print(f"terastack bench gnn --scale: the dataset ({format_bytes(sizes['total'])}) fits in RAM "
              f"({format_bytes(ram)}): not a scale run, the 'larger than RAM' claim is skipped", file=sys.stderr)

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
    root.parent.mkdir(parents=True, exist_ok=True)
    gen = _generate(args, root, nodes, avg_degree, train_nodes, gen_memory)
    say(f"dataset {gen['status']} in {gen['wall_seconds']:.1f} s, generator peak RSS "
        f"{format_bytes(gen['peak_rss_bytes'])}")

    if args.threads:
        torch.set_num_threads(training_threads() if args.threads == -1 else args.threads)
    engine = get_engine()
    with RssWatchdog(rss_limit) as watchdog:
        t0 = time.perf_counter()
        ds = open_dataset(root, topology="ssd", indptr=args.indptr, topology_budget=budget)
        sampler = NeighborSampler(topology=ds.topology, fanouts=fanouts, seed=args.seed)
        train_ids = ds.splits["train"][:train_nodes]
        hot = presample(sampler, train_ids, batch_size, epochs=2, seed=args.seed, keep_examples=4)
        presample_seconds = time.perf_counter() - t0
        # Order matters for the peak: the whole-graph temporaries (hit-rate curve, ranking) are made before the
        # caches are filled, and the pre-sampling counts are dropped before training.
        ssd = probe_feature_file(ds)
        here = Hardware(name="this machine (SSD measured on the feature file)", measured=True,
                        cores=os.cpu_count() or 1, ssd_read_bytes_per_s=ssd["ssd_read_bytes_per_s"],
                        ssd_rand4k_iops=ssd["ssd_rand4k_iops"])
        wl = workload(ds, hot, batch_size=batch_size, model="sage", hidden=args.hidden, layers=len(fanouts),
                      calibrate=True, calibration_steps=5, io_cpu_seconds_per_block=ssd["io_cpu_seconds_per_block"])
        wl = dataclasses.replace(wl, batches_per_epoch=-(-len(train_ids) // batch_size))
        ranking = hot.order()
        split, feature_budget = share_budget(ds, hot, budget, fanouts)
        hot_summary = {"batches": hot.batches, "nodes_per_batch": hot.nodes_per_batch}
        del hot
        cache = UnifiedCache(ds, ranking, device_budget=0, host_budget=feature_budget, device="cpu")
        del ranking
        cached_rows = cache.device_rows + cache.host_rows
        hot_summary["expected_feature_hit_rate"] = float(np.interp(cached_rows, wl.curve_rows, wl.curve_hits))
        predicted = predict_epoch(wl, here, device_cache=0, host_cache=feature_budget,
                                  train_threads=wl.compute_threads)
        torch.manual_seed(args.seed)
        model = GNN("sage", ds.feat_dim, args.hidden, ds.num_classes, len(fanouts))
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        before = engine.stats.snapshot()
        epoch = train_epoch(Pipeline(sampler, cache, ds.labels, device="cpu"), model, opt, train_ids,
                            batch_size=batch_size, epoch=0, progress=not args.quiet, label="scale")
        after = engine.stats.snapshot()
        cache_info = cache.describe()
        topology_info = ds.topology.describe()
        cache.close()
        ds.close()
    peak = peak_rss()
    if args.cleanup:
        shutil.rmtree(root, ignore_errors=True)
    ssd_read = after["bytes_read"] - before["bytes_read"]
    error = abs(predicted.epoch_seconds - epoch["seconds"]) / epoch["seconds"]
    return {
        "scale_run": exceeds,
        "exceeds_ram": exceeds,
        "dataset_bytes": sizes["total"], "mem_total_bytes": ram, "dataset_to_ram_ratio": sizes["total"] / ram,
        "epoch_seconds": epoch["seconds"],
        "peak_rss_bytes": peak, "peak_rss_within_4GiB": peak <= RSS_TARGET,
        "ssd_bytes_read": ssd_read,
        "feature_hit_rate": epoch["device_hit_rate"] + epoch["host_hit_rate"],
        "topology_hit_rate": epoch["topology_hit_rate"],
        "tpc_predicted_epoch_seconds": predicted.epoch_seconds, "tpc_prediction_error": error,
        "train_nodes": len(train_ids), "batches": epoch["batches"], "loss_mean": epoch["loss_mean"],
        "feature_ssd_bytes": epoch["ssd_bytes"], "topology_ssd_bytes": epoch["topology_ssd_bytes"],
        "topology_calls_per_batch": epoch["topology_calls_per_batch"],
        "ssd_requests": after["requests"] - before["requests"],
        "rss": {"peak_bytes": peak, "max_sampled_bytes": watchdog.max_sampled, "limit_bytes": rss_limit,
                "measured": "VmHWM of /proc/self/status (no child processes during training)"},
        "sizes": sizes,
        "budget_bytes": budget, "split": split, "cache": cache_info, "topology": topology_info,
        "tpc": {"bottleneck": predicted.bottleneck, "predicted_hit_rate": predicted.hit_rate,
                "stages_seconds_per_batch": predicted.stages, "ssd": ssd,
                "note": "features-only model: topology reads are not modelled"},
        "epoch": {k: v for k, v in epoch.items() if k != "losses"},
        "presample_seconds": presample_seconds, "presample": hot_summary,
        "generation": {"status": gen["status"], "seconds": gen["wall_seconds"],
                       "peak_rss_bytes": gen["peak_rss_bytes"], "memory_budget": gen_memory},
        "dataset": {"dir": str(root), "nodes": nodes, "edges": gen.get("edges"), "avg_degree": avg_degree,
                    "feat_dim": args.feat_dim, "feat_dtype": args.dtype, "deleted_after_run": bool(args.cleanup)},
        "config": {"model": "sage", "hidden": args.hidden, "fanouts": list(fanouts), "batch_size": batch_size,
                   "lr": args.lr, "seed": args.seed, "indptr": args.indptr, "torch_threads": torch.get_num_threads()},
    }
