"""``terastack gnn train``: out-of-core training of a PyG model over an on-disk dataset, either graph kind.

The steps are the Python API's, in order: open (and verify) the dataset, build
the sampler, pre-sample to count hotness, place and fill the unified cache,
then train epochs through the pipeline, scoring each on the held-out splits
(sampled inference, at most ``eval_nodes`` nodes of each), and optionally save
the model (see terastack.gnn.training.models [Note: model checkpoints]). A homogeneous
and a heterogeneous dataset run the same recipe; what differs is a graph kind
(terastack.gnn.training.graph_kinds [Note: one training recipe for both graph kinds]).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from terastack import trace
from terastack.gnn.training.data_parallel import SyncCheck, checked_step, current_ranks, wrap
from terastack.gnn.storage.dataset import GraphDataset
from terastack.gnn.sampling.fanouts import parse_fanout_spec
from terastack.gnn.training.graph_kinds import open_graph
from terastack.gnn.training.hetero_net import HETERO_MODELS
from terastack.gnn.training.models import MODELS, checkpoint_meta_path, eval_step, train_step
from terastack.gnn.sampling.pipeline import Pipeline, resolve_samplers
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

    ``step(model, optimizer, batch) -> loss`` trains one batch (the default takes either graph kind's batches)."""
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
    """Trains a GNN out of core on a homogeneous (``sage``, ``gcn``, ``gat``) or heterogeneous (``sage`` as
    ``to_hetero(GraphSAGE)``, ``rgcn``) dataset; ``run()`` returns the result dict."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        data: str
        model: str = "sage"
        hidden: int = 128
        #: one list for every relation ("15,10"; -1: every neighbour), or per relation on a heterogeneous
        #: dataset ("cites=15,10;*=5,5"; 0: none from that relation at that hop); see terastack.gnn.sampling.fanouts
        fanouts: tuple[int, ...] | dict | str = (15, 10)
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
        #: terastack.gnn.sampling.pipeline [Note: several sampler threads])
        samplers: int = 0
        #: nodes of each held-out split (validation and test; on a heterogeneous dataset train too) scored after
        #: every epoch (0: none, -1: the whole splits)
        eval_nodes: int = 4096
        #: write the trained model here (weights; its description beside it as PATH.json), "" for nowhere
        save_model: str = ""
        presample_epochs: int = 2
        verify: str = "stamp"
        #: "memory": topology read into RAM; "mmap": topology pages read from SSD on demand; "ssd": topology
        #: read per hop through the storage engine, hot lists cached out of host_cache (terastack.gnn.storage.topology)
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
            if self.model not in MODELS + HETERO_MODELS:
                raise ValueError(f"model: must be one of {', '.join(dict.fromkeys(MODELS + HETERO_MODELS))}; "
                                 f"got {self.model!r}")
            self.fanouts = parse_fanout_spec(self.fanouts)  # the relations are checked once the dataset is open
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
        graph = open_graph(cfg, self.engine)
        ranks = current_ranks()
        try:
            graph.make_sampler()
            train_ids = graph.train_ids()
            opened = time.perf_counter()
            graph.presample(train_ids)
            presampled = time.perf_counter()
            graph.place()
            pipeline = graph.pipeline(ranks)
            torch.manual_seed(cfg.seed)
            model = graph.model().to(pipeline.device)
            trained = _train(cfg, graph, pipeline, model, train_ids, ranks)
            caches = graph.describe_caches()
        finally:
            graph.close()
        checkpoint = graph.save(model, trained["final"]) if cfg.save_model and ranks.leader else None
        return _result(cfg, graph, trained, caches, checkpoint, ranks,
                       setup={"open": opened - t0, "presample": presampled - opened})


def _train(cfg: "GnnTrainer.Config", graph, pipeline: Pipeline, model: torch.nn.Module, train_ids: np.ndarray,
           ranks) -> dict:
    """Train ``cfg.epochs`` epochs, scoring each on the held-out nodes; the epochs, the final scores, the check."""
    net = wrap(model, ranks, pipeline.device)  # data-parallel: terastack.gnn.training.data_parallel
    sync = SyncCheck(model) if cfg.check_sync and ranks.active else None
    step = checked_step(graph.train_step, sync)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # Evaluation nodes: the first eval_nodes of each split, the same ones after every epoch.
    ds = graph.ds
    held_out = {name: ds.splits[name] if cfg.eval_nodes < 0 else ds.splits[name][: cfg.eval_nodes]
                for name in graph.scored if cfg.eval_nodes and len(ds.splits[name])}
    unscored = {f"{k}_acc": None for k in graph.scored}

    def scores() -> dict:
        return {f"{k}_acc": evaluate(pipeline, model, ids, batch_size=cfg.batch_size, step=graph.eval_step)
                for k, ids in held_out.items()}

    epochs = []
    for epoch in range(cfg.epochs):  # train an epoch, then score it on the held-out nodes
        result = train_epoch(pipeline, net, optimizer, train_ids, batch_size=cfg.batch_size, epoch=epoch,
                             progress=cfg.progress and ranks.leader, step=step)
        epochs.append({**result, **unscored, **scores()})
    final = {k: epochs[-1][k] for k in unscored} if epochs else {**unscored, **scores()}
    return {"epochs": epochs, "final": final, "sync": sync}


def _result(cfg: "GnnTrainer.Config", graph, trained: dict, caches: tuple[dict, dict], checkpoint: str | None,
            ranks, *, setup: dict) -> dict:
    epochs, final, sync = trained["epochs"], trained["final"], trained["sync"]
    return {
        **graph.report(setup),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "cache": caches[0], "topology": caches[1],
        "epochs": [{k: v for k, v in e.items() if k != "losses"} for e in epochs],
        "loss_curve": [loss for e in epochs for loss in e["losses"]],
        **final,
        "accuracy": final["test_acc"],  # the last epoch's test accuracy (the older name of test_acc)
        **{f"{k}_acc_per_epoch": [e[f"{k}_acc"] for e in epochs] for k in graph.scored},
        "epoch_seconds": [e["seconds"] for e in epochs],
        "checkpoint": checkpoint,
        "ranks": {"world_size": ranks.world_size, **(sync.to_dict() if sync else {})},
    }
