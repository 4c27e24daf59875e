"""``terastack bench gnn --hetero``: out-of-core training on an IGBH-shaped heterogeneous graph vs the same
pipelined loader over in-memory features and topology, and vs ``np.memmap``.

[Note: the heterogeneous benchmark]
One generated graph (terastack.gnn.storage.gen.HeteroGraphGenerator: paper, author, institute and field-of-study
nodes, IGBH's relations plus their reverses, every type with features of the same width) in the
heterogeneous dataset layout. The one memory budget (``--budget``, default a quarter of the paper
features, so the paper features alone are 4x the budget and all features together about 12x) pays for
every type's cached rows, every relation's cached lists and the lookup tables. Three contenders, each
in its own process (terastack.gnn.bench.workers [Note: contenders in child processes]), train the same
model from the same initial weights on the same batches:

  terastack            features and topology on the SSD, one budget over rows and lists
                       (terastack.gnn.storage.budget_split [Note: one budget over node types and relations])
  in_memory_pipelined  every feature and every relation's topology in RAM, the same pipeline
  mmap                 features (page cache held to the budget, shared by type in proportion to
                       their files) and topology (page cache left to the kernel) in ``np.memmap``,
                       gathered by one thread; ``mmap_<k>_threads``: the same by k threads at once
                       (``--mmap-threads``, [Note: the np.memmap baselines])

The terastack and in-memory epochs take turns (``--epochs`` each); each mmap contender runs the first
``--mmap-warmup-batches + --mmap-batches`` batches of epoch 0 and is compared on the same window
([Note: comparing the same batches]), then terastack and each mmap contender run that window again with
the training step left out (``loader_speedup_vs_mmap``: the loader alone, as an accelerator's user sees
it). Loss curves must be identical (every source gives the file's bytes). Headline:
``slowdown_vs_in_memory_pipelined`` (mean terastack epoch / mean in-memory epoch), ``speedup_vs_mmap``
(against the fastest mmap contender), and ``tpc_error``: the TPC model's prediction (made before training, from
pre-sampled and hold-out batches: terastack.gnn.bench.scale [Note: the scale run] explains the inputs)
against the mean terastack epoch. The hit rate the model is given is the hold-out's at the split the
budget made (every type's cache as placed), not a curve over cache sizes. The generated dataset is
deleted at the end unless ``--keep``.

[Note: why the training figure is compute-bound on a CPU]
to_hetero(GraphSAGE) aggregates the raw 1024-wide features over every sampled edge of every relation
before its first linear layer, so the step's time hardly depends on the hidden size (2-core VM, one torch
thread, 39k nodes a batch: 2.70 s at hidden 128, 2.56 s at 32, 2.29 s at 16). On such a machine every
contender's epoch is at least the step's, which caps ``speedup_vs_mmap`` at (mmap loader's batch time) /
(step time) whatever terastack does; the ``loader_*`` figures are the comparison without that cap.
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from terastack.constants import BLOCK
from terastack.gnn.advise import (training_steps, measure_gather_costs, miss_blocks, predict_under_load,
                                  probe_feature_file, profile_sampling, rank_positions, sample_seed_sets)
from terastack.gnn.bench.workers import Contender, GraphContender, bench_dir, generate_or_replace, measure_window, mmap_name, parse_mmap_threads, window_seconds
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.storage.features import TypedFeatures
from terastack.gnn.storage.gen import HeteroGraphGenerator
from terastack.gnn.training.train import training_threads
from terastack.plan.tpc import GnnWorkload, blocks_per_miss
from terastack.units import format_bytes, parse_bytes

HETERO_DEFAULTS = {"papers": 250_000, "train_nodes": 65536, "batch_size": 1024, "fanouts": "10,5",
                   "presample_nodes": 16384, "holdout_nodes": 4096, "gen_memory": "1GiB"}
CONTENDERS = ("terastack", "in_memory_pipelined", "mmap")


class HeteroContender(GraphContender):
    """One contender of [Note: the heterogeneous benchmark], built in its child process; terastack's also measures
    what the TPC model takes and predicts its epoch."""

    def __init__(self, *, kind: str, presample_nodes: int = 0, holdout_nodes: int = 0, load_probe_seconds: float = 8.0,
                 disk_probe_seconds: float = 1.5, **common):
        self._model_kind, self._hidden, self._load_probe_seconds = common["model"], common["hidden"], load_probe_seconds
        self._disk_probe_seconds, self._sample_sizes = disk_probe_seconds, (presample_nodes, holdout_nodes)
        self.info: dict = {}
        started = time.perf_counter()
        super().__init__(kind=kind, **common)
        if kind == "terastack":
            self._out_of_core(started)

    def presample_seeds(self):
        # one pass over a sample of the seeds: the hold-out, not a pre-sampled epoch, scores the placement
        self.placed_from, self.holdout = sample_seed_sets(self.train_ids, *self._sample_sizes, seed=self.seed)
        return self.placed_from

    def _out_of_core(self, started: float) -> None:
        """Measure the hold-out with the lists in place and the caches placed, and predict the epoch (kept for
        :meth:`describe`)."""
        ds, sampler, hot, features = self.ds, self.sampler, self.placed.hotness, self.features
        prof = profile_sampling(sampler, self.holdout, self.batch_size, seed=self.seed)
        prof.pop("ids")
        per_batch = prof.pop("ids_per_batch")
        featured = {t: f for t in ds.node_types if (f := ds.node_features(t)) is not None}
        rows = missed = blocks = 0
        for t, f in featured.items():
            cache = features.sources[t]
            r, m, b = miss_blocks(rank_positions(hot[t].order(), ds.node_counts[t]), per_batch.get(t, []),
                                  cache.device_rows + cache.host_rows, f.row_bytes)
            rows, missed, blocks = rows + r, missed + m, blocks + b
        hits = rows - missed
        prof["feature_blocks_per_missed_row"] = blocks / max(missed, 1)
        self.info = {"split": self.placed.split.info, "budgets": {t: list(b) for t, b in self.placed.split.budgets.items()},
                     "holdout": prof, "placed_from_seeds": len(self.placed_from), "holdout_seeds": len(self.holdout),
                     "presample": {"batches": hot[ds.target].batches,
                                   "nodes_per_batch": {t: h.nodes_per_batch for t, h in hot.items()}},
                     "holdout_feature_hit_rate": hits / max(rows, 1)}
        self._predict(featured, features, hot[ds.target].examples, prof, hits / max(rows, 1))
        self.info["setup_seconds"] = time.perf_counter() - started

    def _predict(self, featured: dict, features: TypedFeatures, examples: list, prof: dict, hit: float) -> None:
        """The TPC prediction of one epoch; see [Note: the heterogeneous benchmark]."""
        ds = self.ds
        row_bytes = {f.row_bytes for f in featured.values()}
        if len(row_bytes) != 1:
            raise ValueError("feat_dim: the benchmark's TPC check needs every featured type to have the same width")
        row_bytes = row_bytes.pop()
        lead = ds.target if ds.target in featured else next(iter(featured))
        lead_file = SimpleNamespace(features_path=featured[lead].features_path,
                                    feature_bytes=featured[lead].num_nodes * row_bytes)
        ssd = probe_feature_file(lead_file, seconds=self._disk_probe_seconds)
        nodes = sum(f.num_nodes for f in featured.values())
        cached = sum(features.sources[t].device_rows + features.sources[t].host_rows for t in featured)
        rows_per_batch = sum(prof["rows_per_batch"].get(t, 0.0) for t in featured)
        trained_per_batch = sum(prof["rows_per_batch"].values())
        dtype = torch.from_numpy(np.zeros(0, featured[lead].feat_dtype)).dtype
        per_row, per_miss = measure_gather_costs(nodes, featured[lead].feat_dim, dtype, rows_per_batch)
        # the hit rate at the split the budget made (a curve of three points: 0, the cached rows, all rows)
        curve_rows = [0, cached, nodes] if 0 < cached < nodes else [0, nodes]
        curve_hits = [0.0, hit, 1.0] if 0 < cached < nodes else [0.0, 1.0]
        wl = GnnWorkload(num_nodes=nodes, row_bytes=row_bytes, feature_bytes=nodes * row_bytes,
                         batches_per_epoch=-(-len(self.train_ids) // self.batch_size), nodes_per_batch=rows_per_batch,
                         curve_rows=curve_rows, curve_hits=curve_hits,
                         blocks_per_miss=prof["feature_blocks_per_missed_row"] or blocks_per_miss(row_bytes),
                         sample_seconds=prof["sample_cpu_seconds_per_batch"], compute_seconds=None,
                         compute_threads=torch.get_num_threads(), gather_seconds_per_row=per_row,
                         miss_cpu_seconds_per_row=per_miss, io_cpu_seconds_per_block=ssd["io_cpu_seconds_per_block"],
                         table_bytes_per_node=4, topology_blocks_per_batch=prof["topology_blocks_per_batch"])
        host = cached * row_bytes + nodes * 4
        # the SSD's rate and the step under the epoch's own load; the disk alone is reported beside
        steps = training_steps(self._model_kind, examples, ds, hidden=self._hidden, layers=self.sampler.hops,
                               seed=self.seed)
        pred, loaded = predict_under_load(wl, ssd, lead_file, steps, rows=trained_per_batch, host_cache=host,
                                          seconds=self._load_probe_seconds, seed=self.seed,
                                          where="a feature file, beside the steps")
        compute = loaded["compute_seconds_per_batch"]
        self.info["tpc"] = {**pred.to_dict(), "ssd": ssd, "ssd_while_training": loaded,
                            "compute_seconds_per_batch": compute,
                            "topology_blocks_per_batch": wl.topology_blocks_per_batch,
                            "topology_read_seconds_per_batch": wl.topology_blocks_per_batch * BLOCK
                            / min(ssd["ssd_read_bytes_per_s"], ssd["ssd_rand4k_iops"] * BLOCK)}


def _generate(args, root: Path, papers: int, train_nodes: int) -> dict:
    return generate_or_replace(HeteroGraphGenerator, dict(
        out=str(root), papers=papers, feat_dim=args.feat_dim, classes=args.classes, dtype=args.dtype, seed=args.seed,
        train_nodes=train_nodes, test_nodes=args.test_nodes, memory_budget=args.gen_memory or HETERO_DEFAULTS["gen_memory"],
        progress=not args.quiet), fresh=bool(args.fresh))


def measure_hetero(args) -> dict:
    papers = args.papers or HETERO_DEFAULTS["papers"]
    train_nodes = args.train_nodes or min(HETERO_DEFAULTS["train_nodes"], papers // 2)
    batch_size = args.batch_size or HETERO_DEFAULTS["batch_size"]
    fanouts = args.fanouts or HETERO_DEFAULTS["fanouts"]
    rss_limit = parse_bytes(args.rss_limit, field="rss_limit")
    if args.epochs < 1:
        raise ValueError(f"epochs: must be >= 1, got {args.epochs}")
    threads = training_threads(args.threads)
    mmap_threads = parse_mmap_threads(args.mmap_threads)
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    root = bench_dir(args, "bench-gnn-hetero")
    started = time.perf_counter()
    contenders: dict[str, Contender] = {}
    try:
        gen = _generate(args, root, papers, train_nodes)
        gen_seconds = time.perf_counter() - started
        ds = open_dataset(root, verify="size")
        feature_bytes = {t: f.num_nodes * f.row_bytes for t in ds.node_types if (f := ds.node_features(t))}
        nodes, edges = dict(ds.node_counts), {"___".join(et): n for et, n in ds.edge_counts.items()}
        ds.close()
        budget = parse_bytes(args.budget, field="budget") if args.budget else feature_bytes["paper"] // 4
        if budget * 4 > feature_bytes["paper"]:
            raise ValueError(f"budget: {format_bytes(budget)} is more than a quarter of the "
                             f"{format_bytes(feature_bytes['paper'])} of paper features; the benchmark is out-of-core "
                             "only below that")
        say(f"hetero bench: {nodes} nodes, features {format_bytes(sum(feature_bytes.values()))} (paper "
            f"{format_bytes(feature_bytes['paper'])}), budget {format_bytes(budget)}")
        common = dict(root=str(root), model=args.hetero_model, fanouts=fanouts, hidden=args.hidden, lr=args.lr,
                      seed=args.seed, batch_size=batch_size, budget=budget, threads=threads)
        contenders["terastack"] = Contender("terastack", "terastack.gnn.bench.hetero:HeteroContender", dict(
            kind="terastack", presample_nodes=args.presample_nodes or HETERO_DEFAULTS["presample_nodes"],
            holdout_nodes=args.holdout_nodes or HETERO_DEFAULTS["holdout_nodes"], indptr=args.indptr,
            load_probe_seconds=args.load_probe_seconds, disk_probe_seconds=args.disk_probe_seconds, **common),
            rss_limit=rss_limit)
        contenders["in_memory_pipelined"] = Contender(
            "in_memory_pipelined", "terastack.gnn.bench.hetero:HeteroContender",
            dict(kind="in_memory_pipelined", **common), rss_limit=rss_limit)
        for k in mmap_threads:
            contenders[mmap_name(k)] = Contender(mmap_name(k), "terastack.gnn.bench.hetero:HeteroContender",
                                                 dict(kind="mmap", mmap_threads=k, **common), rss_limit=rss_limit)
        results = _race(contenders, args, say, mmap_threads)
        accuracy = {name: contenders[name].call("accuracy")["test_acc"] for name in CONTENDERS[:2]}
        described = contenders["terastack"].call("describe")
    finally:
        for c in contenders.values():
            c.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return _report(results, accuracy, described, contenders, budget=budget, feature_bytes=feature_bytes, nodes=nodes,
                   edges=edges, gen=gen, gen_seconds=gen_seconds, root=root, args=args, fanouts=fanouts,
                   batch_size=batch_size, threads=threads, mmap_threads=mmap_threads)


def _race(contenders: dict, args, say, mmap_threads: list[int]) -> dict:
    """Epochs of terastack and the in-memory pipeline taking turns; the mmap contenders' window in epoch 0, then
    the same window with the training step left out ([Note: the np.memmap baselines])."""
    mmaps = [mmap_name(k) for k in mmap_threads]
    results: dict[str, list] = {name: [] for name in (*CONTENDERS[:2], *mmaps)}
    for epoch in range(args.epochs):
        for name in CONTENDERS[:2]:
            results[name].append(contenders[name].call("run", epoch=epoch))
            say(f"{name} epoch {epoch}: {results[name][-1]['seconds']:.2f} s")
        if epoch == 0:
            total = results["terastack"][0]["batches"]
            first, count = measure_window(total, args.mmap_warmup_batches, args.mmap_batches)
            results["window"] = [first, count]
            for name in mmaps:
                results[name].append(contenders[name].call("run", epoch=0, limit=first + count))
                say(f"{name} batches 0..{first + count - 1}: {results[name][0]['seconds']:.2f} s")
    first, count = results["window"]
    results["loader"] = {}
    for name in ("terastack", *mmaps):  # the same window, epoch 0's batches, no training step
        results["loader"][name] = contenders[name].call("run", epoch=0, limit=first + count, train=False)
        say(f"{name} loader alone, batches 0..{first + count - 1}: {results['loader'][name]['seconds']:.2f} s")
    return results


def _report(results: dict, accuracy: dict, described: dict, contenders: dict, *, budget, feature_bytes, nodes,
            edges, gen, gen_seconds, root, args, fanouts, batch_size, threads, mmap_threads) -> dict:
    ts, mem = results["terastack"], results["in_memory_pipelined"]
    mmaps = {k: results[mmap_name(k)][0] for k in mmap_threads}
    first, count = results["window"]
    ts_t, mem_t = [e["seconds"] for e in ts], [e["seconds"] for e in mem]
    tpc = described["info"]["tpc"]
    measured = float(np.mean(ts_t))
    ts_window = window_seconds(ts[0]["marks"], first, count)
    mm_windows = {k: window_seconds(mm["marks"], first, count) for k, mm in mmaps.items()}
    loader = {name: window_seconds(r["marks"], first, count) for name, r in results["loader"].items()}
    loader_mm = {k: loader[mmap_name(k)] for k in mmap_threads}
    strongest = min(mm_windows, key=mm_windows.get)  # [Note: the np.memmap baselines]
    loader_strongest = min(loader_mm, key=loader_mm.get)
    identical = (all(a["losses"] == b["losses"] for a, b in zip(ts, mem))
                 and all(mm["losses"] == ts[0]["losses"][: len(mm["losses"])] for mm in mmaps.values()))
    peaks = {name: max(c.setup["peak_rss_bytes"], *(r["peak_rss_bytes"] for r in results[name]),
                       *([results["loader"][name]["peak_rss_bytes"]] if name in results["loader"] else []))
             for name, c in contenders.items()}
    strip = lambda e: {k: v for k, v in e.items() if k not in ("marks", "losses")}  # noqa: E731
    mm = mmaps[mmap_threads[0]]
    return {
        "slowdown_vs_in_memory_pipelined": measured / float(np.mean(mem_t)),
        "speedup_vs_mmap": mm_windows[strongest] / ts_window,
        "speedup_vs_mmap_by_threads": {str(k): w / ts_window for k, w in mm_windows.items()},
        "loader_speedup_vs_mmap": loader_mm[loader_strongest] / loader["terastack"],
        "loader_speedup_vs_mmap_by_threads": {str(k): w / loader["terastack"] for k, w in loader_mm.items()},
        "tpc_error": abs(tpc["epoch_seconds"] - measured) / measured,
        "loss_curves_identical": identical,
        "feature_to_budget_ratio": feature_bytes["paper"] / budget,
        "terastack_epoch_seconds": ts_t, "in_memory_pipelined_epoch_seconds": mem_t,
        "mmap": {"window": [first, first + count], "window_seconds": mm_windows[strongest],
                 "terastack_window_seconds": ts_window, "strongest_threads": strongest,
                 "window_seconds_by_threads": {str(k): w for k, w in mm_windows.items()},
                 "epoch_seconds_extrapolated": mm_windows[strongest] / count * ts[0]["batches"],
                 "epoch_measured": f"batches {first}..{first + count - 1} of {ts[0]['batches']}, extrapolated",
                 "loader_window_seconds": {str(k): w for k, w in loader_mm.items()},
                 "terastack_loader_window_seconds": loader["terastack"],
                 "loader_strongest_threads": loader_strongest,
                 "gather_seconds_per_batch_by_threads": {str(k): r["gather_seconds"] / max(r["batches"], 1)
                                                         for k, r in mmaps.items()},
                 "budget_bytes": budget,
                 "note": "features held to the budget (shared by type) in every mmap contender; the mapped "
                         "topology's page cache left to the kernel; speedup_vs_mmap is against the fastest "
                         "contender (--mmap-threads); loader_*: the same window with the training step left out"},
        "tpc_predicted_epoch_seconds": tpc["epoch_seconds"], "tpc": tpc,
        "hit_rates": {"feature": ts[0]["feature_hit_rate"], "topology": ts[0]["topology_hit_rate"],
                      "feature_predicted_from_holdout": described["info"]["holdout_feature_hit_rate"],
                      "topology_holdout": described["info"]["holdout"]["topology_hit_rate"]},
        "seeds_per_s": ts[0]["seeds"] / ts_t[0] if ts_t[0] else 0.0, "train_nodes": ts[0]["seeds"],
        "accuracy": accuracy, "accuracy_diff_points": 100 * abs((accuracy["terastack"] or 0)
                                                                - (accuracy["in_memory_pipelined"] or 0)),
        "peak_rss_bytes": peaks,
        "terastack_epochs": [strip(e) for e in ts], "in_memory_pipelined_epochs": [strip(e) for e in mem],
        "mmap_run": strip(mm),
        "mmap_runs": {str(k): strip(r) for k, r in mmaps.items()},
        "loader_runs": {name: strip(r) for name, r in results["loader"].items()},
        "cache": described["cache"], "topology": described["topology"],
        "split": described["info"]["split"], "holdout": described["info"]["holdout"],
        "presample": described["info"]["presample"], "terastack_setup_seconds": described["info"]["setup_seconds"],
        "budget_bytes": budget,
        "dataset": {"dir": str(root), "nodes": nodes, "edges": edges, "feature_bytes": feature_bytes,
                    "feat_dim": args.feat_dim, "feat_dtype": args.dtype, "generation": gen.get("status"),
                    "generation_seconds": gen_seconds, "deleted_after_run": not args.keep},
        "config": {"model": args.hetero_model, "hidden": args.hidden, "fanouts": fanouts, "batch_size": batch_size,
                   "epochs": args.epochs, "lr": args.lr, "seed": args.seed, "torch_threads": threads,
                   "mmap_threads": mmap_threads,
                   "processes": "one per contender (spawned), RSS watchdog at --rss-limit"},
    }

