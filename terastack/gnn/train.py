"""``terastack gnn train``: out-of-core training of a PyG model over an on-disk dataset.

The steps are the Python API's, in order: open (and verify) the dataset, build
the sampler, pre-sample to count hotness, place and fill the unified cache,
then train epochs through the pipeline, scoring each on the validation and
test splits (sampled inference, at most ``eval_nodes`` nodes of each), and
optionally save the model (see terastack.gnn.models [Note: model checkpoints]).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from terastack import trace
from terastack.constants import BLOCK
from terastack.gnn.cache import UnifiedCache
from terastack.gnn.data_parallel import SyncCheck, checked_step, current_ranks, wrap
from terastack.gnn.dataset import GraphDataset, open_dataset
from terastack.gnn.hotness import presample
from terastack.gnn.models import MODELS, GNN, checkpoint_meta_path, eval_step, save_model, train_step
from terastack.gnn.pipeline import Pipeline, resolve_samplers
from terastack.gnn.fanouts import largest_draw, parse_fanouts
from terastack.gnn.sampler import NeighborSampler
from terastack.gnn.topology import SsdTopology, split_budget
from terastack.plan.tpc import blocks_per_miss
from terastack.progress import Progress
from terastack.units import parse_bytes

#: the epoch number whose random stream drives evaluation batches (never a training epoch)
EVAL_EPOCH = 1 << 30


def training_threads() -> int:
    """Intra-op threads for training on the CPU beside the pipeline: one less than the cores.

    The sampling and gathering threads need a core; an OpenMP team that spans
    every core stalls each time one of its threads is descheduled (measured:
    steps 5-10x slower on a busy 2-core machine).
    """
    import os

    return max(1, (os.cpu_count() or 1) - 1)


def train_epoch(pipeline: Pipeline, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_ids: np.ndarray,
                *, batch_size: int, epoch: int, progress: bool = True, label: str = "train", step=train_step) -> dict:
    """Train one epoch through ``pipeline``: time, losses, per-tier hit rates and SSD traffic.

    ``step(model, optimizer, batch) -> loss`` trains one batch (heterogeneous batches take
    terastack.gnn.hetero_models.hetero_train_step)."""
    source = pipeline.source
    topology = pipeline.sampler.topology
    before = source.stats.snapshot()
    topo_before = topology.stats.snapshot()
    batches = -(-len(train_ids) // batch_size)
    bar = Progress(batches, label=f"{label} epoch {epoch}", unit="batches", enabled=progress)
    losses = []
    started = time.perf_counter()
    for k, data in enumerate(pipeline.epoch(train_ids, batch_size, epoch=epoch)):
        with trace.span(f"train {k}", track="train", cat="gnn", nodes=int(data.num_nodes)):
            losses.append(step(model, optimizer, data))
        if progress:
            now = source.stats.snapshot()
            rows = max(now["rows"] - before["rows"], 1)
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.update(1, loss=losses[-1], dev_hit=(now["device_hits"] - before["device_hits"]) / rows,
                       host_hit=(now["host_hits"] - before["host_hits"]) / rows,
                       ssd_GBps=(now["ssd_bytes"] - before["ssd_bytes"]) / elapsed / 1e9)
    seconds = time.perf_counter() - started
    bar.close()
    after = source.stats.snapshot()
    delta = {k: after[k] - before[k] for k in ("rows", "device_hits", "host_hits", "misses", "ssd_bytes", "ssd_blocks",
                                               "ssd_calls", "batches", "io_wait_seconds")}
    rows = max(delta["rows"], 1)
    topo_after = topology.stats.snapshot()
    topo = {k: topo_after[k] - topo_before[k] for k in ("lookups", "hits", "indptr_calls", "indices_calls",
                                                        "ssd_bytes")}
    st = pipeline.last_stats
    return {
        "epoch": epoch, "seconds": seconds, "batches": len(losses),
        "batches_per_s": len(losses) / seconds if seconds else 0.0,
        "loss_mean": float(np.mean(losses)) if losses else float("nan"), "losses": losses,
        "device_hit_rate": delta["device_hits"] / rows, "host_hit_rate": delta["host_hits"] / rows,
        "miss_rate": delta["misses"] / rows, "ssd_bytes": delta["ssd_bytes"], "ssd_blocks": delta["ssd_blocks"],
        "ssd_calls_per_batch": delta["ssd_calls"] / max(delta["batches"], 1),
        "ssd_GBps": delta["ssd_bytes"] / seconds / 1e9 if seconds else 0.0,
        "rows_gathered": delta["rows"], "sample_seconds": st.sample_seconds, "gather_seconds": st.gather_seconds,
        "io_wait_seconds": delta["io_wait_seconds"], "stall_seconds": st.stall_seconds,
        "max_batch_rows": st.max_rows, "seeds": st.seeds, "samplers": pipeline.config.samplers,
        # the sampler's topology: lists served from memory, and what was read from the SSD for the rest
        "topology_hit_rate": topo["hits"] / max(topo["lookups"], 1), "topology_ssd_bytes": topo["ssd_bytes"],
        "topology_calls_per_batch": (topo["indptr_calls"] + topo["indices_calls"]) / max(len(losses), 1),
    }


def share_budget(ds, hot, host_budget: int, fanouts) -> tuple[dict, int]:
    """With the topology on the SSD: cache hot neighbour lists out of ``host_budget``, by SSD bytes saved per
    byte (terastack.gnn.topology [Note: splitting one budget between topology and features]).

    Returns (a description of the split, the host budget left for feature rows). indptr, when the topology
    holds it in memory, is paid for first; the feature cache's lookup table (4 bytes per node) is set aside.
    """
    topo = ds.topology
    if not isinstance(topo, SsdTopology):
        return {}, host_budget
    held = topo.memory_bytes  # indptr, if in memory
    if held > host_budget:
        raise ValueError(f"host_cache: {host_budget} bytes cannot hold indptr in memory ({held} bytes for "
                         f"{ds.num_nodes} nodes); raise host_cache or read indptr from the SSD (indptr='ssd')")
    table = ds.num_nodes * (4 if ds.num_nodes < 2**31 else 8)
    split = split_budget(max(0, host_budget - held - table), feature_counts=hot.counts, expansions=hot.expansions,
                         degrees_of=topo.degrees, row_bytes=ds.row_bytes,
                         feature_read_bytes=blocks_per_miss(ds.row_bytes) * BLOCK,
                         index_itemsize=topo.index_dtype.itemsize, max_fanout=largest_draw(fanouts),
                         indptr_on_ssd=not topo.indptr_in_memory)
    started = time.perf_counter()
    read = topo.fill(split.topology_nodes)
    info = {**split.to_dict(), "indptr": "memory" if topo.indptr_in_memory else "ssd", "indptr_bytes": held,
            "fill_bytes_read": read, "fill_seconds": time.perf_counter() - started}
    return info, max(0, host_budget - topo.memory_bytes)


def fit(pipeline: Pipeline, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_ids: np.ndarray, *,
        batch_size: int, epochs: int, first_epoch: int = 0, progress: bool = True, label: str = "train") -> list[dict]:
    """Train ``epochs`` epochs; one :func:`train_epoch` dict per epoch."""
    return [train_epoch(pipeline, model, optimizer, train_ids, batch_size=batch_size, epoch=e, progress=progress,
                        label=label) for e in range(first_epoch, first_epoch + epochs)]


def evaluate(pipeline: Pipeline, model: torch.nn.Module, ids: np.ndarray, *, batch_size: int,
             step=eval_step) -> float:
    """Accuracy on the seed nodes ``ids`` (sampled inference, fixed random stream); ``step(model, batch)``
    returns (correct, total)."""
    correct = total = 0
    for data in pipeline.epoch(ids, batch_size, epoch=EVAL_EPOCH, shuffle=False, shard=False):
        c, t = step(model, data)
        correct, total = correct + c, total + t
    return correct / max(total, 1)


class GnnTrainer:
    """Trains a GNN (``sage``, ``gcn``, ``gat``) out of core; ``run()`` returns the result dict."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        data: str
        model: str = "sage"
        hidden: int = 128
        fanouts: tuple[int, ...] | str = (15, 10)
        batch_size: int = 1024
        epochs: int = 1
        lr: float = 3e-3
        device_cache: int | str = 0
        host_cache: int | str = "256MiB"
        seed: int = 0
        replace: bool = False
        #: False: sample, gather and train one after another (no overlap)
        overlap: bool = True
        depth: int = 1
        #: sampler threads of the pipeline (0: 2 with the topology on the SSD, else 1;
        #: terastack.gnn.pipeline [Note: several sampler threads])
        samplers: int = 0
        #: validation and test nodes (each) to evaluate on after every epoch (0: none, -1: the whole splits)
        eval_nodes: int = 4096
        #: write the trained model here (weights; its description beside it as PATH.json), "" for nowhere
        save_model: str = ""
        presample_epochs: int = 2
        verify: str = "stamp"
        #: "memory": topology read into RAM; "mmap": topology pages read from SSD on demand; "ssd": topology
        #: read per hop through the storage engine, hot lists cached out of host_cache (terastack.gnn.topology)
        topology: str = "memory"
        #: with topology="ssd": indptr in memory, on the SSD, or "auto" (memory when <= a quarter of host_cache)
        indptr: str = "auto"
        device: str = "auto"
        progress: bool = True
        #: with several ranks: gather every rank's parameters after every step and report the largest difference
        check_sync: bool = False

        def __post_init__(self) -> None:
            if not self.data:
                raise ValueError("data: a dataset directory is required")
            if self.model not in MODELS:
                raise ValueError(f"model: must be one of {', '.join(MODELS)}; got {self.model!r}")
            if isinstance(self.fanouts, str):
                self.fanouts = parse_fanouts(self.fanouts)
            NeighborSampler.Config(fanouts=self.fanouts)  # validates
            self.fanouts = tuple(self.fanouts)
            for name in ("hidden", "batch_size", "depth", "presample_epochs"):
                if getattr(self, name) < 1:
                    raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
            resolve_samplers(self.samplers, None)  # validates
            if self.epochs < 0:
                raise ValueError(f"epochs: must be >= 0, got {self.epochs}")
            if not self.lr > 0:
                raise ValueError(f"lr: must be > 0, got {self.lr}")
            GraphDataset.Config(root=self.data, verify=self.verify, topology=self.topology,
                                indptr=self.indptr)  # validates them
            if self.save_model:
                checkpoint_meta_path(self.save_model)  # validates the name
            self.device_cache = parse_bytes(self.device_cache, field="device_cache")
            self.host_cache = parse_bytes(self.host_cache, field="host_cache")

    def __init__(self, config: "GnnTrainer.Config", *, engine=None):
        self.config = config
        self.engine = engine

    def run(self) -> dict:
        cfg = self.config
        t0 = time.perf_counter()
        ds = open_dataset(cfg.data, verify=cfg.verify, topology=cfg.topology, indptr=cfg.indptr,
                          topology_budget=cfg.host_cache, engine=self.engine)
        opened = time.perf_counter()
        sampler = NeighborSampler(topology=ds.topology, fanouts=cfg.fanouts, replace=cfg.replace, seed=cfg.seed)
        train_ids = ds.splits["train"]
        if len(train_ids) == 0:
            raise ValueError(f"{ds.paths['train_idx']}: the training split is empty")
        hot = presample(sampler, train_ids, cfg.batch_size, epochs=cfg.presample_epochs, seed=cfg.seed)
        presampled = time.perf_counter()
        split, feature_host = share_budget(ds, hot, cfg.host_cache, cfg.fanouts)
        cache = UnifiedCache(ds, hot.order(), device_budget=cfg.device_cache, host_budget=feature_host,
                             device=cfg.device, engine=self.engine)
        ranks = current_ranks()
        try:
            pipeline = Pipeline(sampler, cache, ds.labels, overlap=cfg.overlap, depth=cfg.depth, device=cfg.device,
                                rank=ranks.rank, world_size=ranks.world_size,
                                samplers=resolve_samplers(cfg.samplers, ds.topology))
            torch.manual_seed(cfg.seed)
            model = GNN(cfg.model, ds.feat_dim, cfg.hidden, ds.num_classes, len(cfg.fanouts)).to(pipeline.device)
            net = wrap(model, ranks, pipeline.device)  # data-parallel: terastack.gnn.data_parallel
            sync = SyncCheck(model) if cfg.check_sync and ranks.active else None
            step = checked_step(train_step, sync)
            optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
            # Evaluation nodes: the first eval_nodes of each split, the same ones after every epoch.
            held_out = {name: ds.splits[name] if cfg.eval_nodes < 0 else ds.splits[name][: cfg.eval_nodes]
                        for name in ("val", "test") if cfg.eval_nodes and len(ds.splits[name])}

            def scores() -> dict:
                return {f"{k}_acc": evaluate(pipeline, model, ids, batch_size=cfg.batch_size)
                        for k, ids in held_out.items()}

            epochs = []
            for epoch in range(cfg.epochs):  # train an epoch, then score it on the validation and test nodes
                result = train_epoch(pipeline, net, optimizer, train_ids, batch_size=cfg.batch_size, epoch=epoch,
                                     progress=cfg.progress and ranks.leader, step=step)
                epochs.append({**result, "val_acc": None, "test_acc": None, **scores()})
            final = {k: epochs[-1][k] for k in ("val_acc", "test_acc")} if epochs else \
                {"val_acc": None, "test_acc": None, **scores()}
            cache_info = cache.describe()
            topology_info = {**ds.topology.describe(), "split": split}
        finally:
            cache.close()
            ds.close()
        checkpoint = None
        if cfg.save_model and ranks.leader:
            checkpoint = str(save_model(model, cfg.save_model, dataset={
                "root": str(ds.root), "nodes": ds.num_nodes, "feat_dim": ds.feat_dim, "classes": ds.num_classes},
                training={"fanouts": list(cfg.fanouts), "epochs": cfg.epochs, "lr": cfg.lr, "seed": cfg.seed},
                val_acc=final["val_acc"], test_acc=final["test_acc"]))
        losses = [loss for e in epochs for loss in e["losses"]]
        return {
            "dataset": {"root": str(ds.root), "nodes": ds.num_nodes, "edges": ds.num_edges, "feat_dim": ds.feat_dim,
                        "feat_dtype": ds.feat_dtype.name, "feature_bytes": ds.feature_bytes,
                        "verified": ds.verified},
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
            "cache": cache_info,
            "topology": topology_info,
            "presample": {"batches": hot.batches, "nodes_per_batch": hot.nodes_per_batch,
                          "sample_seconds_per_batch": hot.sample_seconds_per_batch,
                          "expected_hit_rate": hot.hit_rate(cache.device_rows + cache.host_rows)},
            "setup_seconds": {"open": opened - t0, "presample": presampled - opened, "cache_fill": cache.fill_seconds},
            "epochs": [{k: v for k, v in e.items() if k != "losses"} for e in epochs],
            "loss_curve": losses,
            "accuracy": final["test_acc"],  # the last epoch's test accuracy (the older name of test_acc)
            "val_acc": final["val_acc"], "test_acc": final["test_acc"],
            "val_acc_per_epoch": [e["val_acc"] for e in epochs], "test_acc_per_epoch": [e["test_acc"] for e in epochs],
            "epoch_seconds": [e["seconds"] for e in epochs],
            "checkpoint": checkpoint,
            "ranks": {"world_size": ranks.world_size, **(sync.to_dict() if sync else {})},
        }
