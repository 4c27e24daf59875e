"""Out-of-core training on a heterogeneous dataset: every node type's features and every relation's lists on the
SSD behind one cache budget, the same pipeline, R-GCN or ``to_hetero(GraphSAGE)``.

[Note: one budget over node types and relations]
The host budget pays first for what must be in memory (every featured type's lookup table, 4 bytes per
node, and every relation's indptr when it is held in memory); the rest is divided by one greedy over
every candidate at once -- each node type's feature rows and, with the topology on the SSD, each
relation's neighbour lists -- by SSD bytes saved per byte of memory, the rule of terastack.gnn.topology
[Note: splitting one budget between topology and features]: a row of type t saves ``c_v * B_row(t)`` per
pass for ``row_bytes(t)``; the list of node v in relation r saves ``x_v * (B_list + B_ptr)`` for
``d_v * s + 24``, where ``x_v`` counts how often v (of r's destination type) was expanded. Each type's
cache (terastack.gnn.cache.UnifiedCache) then gets the bytes its rows won and places its hottest rows.
The device budget is divided the same way among feature rows only (lists stay in host memory).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from terastack.constants import BLOCK
from terastack.gnn.cache import FeatureSource, Gathering, GatherStats, UnifiedCache
from terastack.gnn.data_parallel import SyncCheck, checked_step, current_ranks, wrap
from terastack.gnn.dataset import check_read_modes
from terastack.gnn.fanouts import largest_draw
from terastack.gnn.hetero_dataset import HeteroDataset, open_hetero_dataset
from terastack.gnn.hetero_models import HETERO_MODELS, HeteroGNN, hetero_eval_step, hetero_train_step
from terastack.gnn.hetero_sampler import HeteroNeighborSampler, HeteroSampledBatch, hetero_presample
from terastack.gnn.models import checkpoint_meta_path, save_model
from terastack.gnn.pipeline import Pipeline, resolve_samplers
from terastack.gnn.topology import FeaturePart, ListPart, SsdTopology, split_budget_parts
from terastack.gnn.train import evaluate, train_epoch
from terastack.plan.tpc import blocks_per_miss
from terastack.units import parse_bytes

class ConstantFeatures(FeatureSource):
    """A featureless node type's feature: 1.0, width 1 (nothing is read)."""

    name = "constant"
    row_len = 1
    torch_dtype = torch.float32

    def gather(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        out.fill_(1.0)
        self.stats.add(rows=len(ids), host_hits=len(ids), batches=1)
        return out


class _Totals:
    """Every type's gather statistics summed (a batch counts once)."""

    def __init__(self, parts: tuple):
        self.parts = parts

    def snapshot(self) -> dict:
        snaps = [p.stats.snapshot() for p in self.parts]
        keys = [k for k, v in GatherStats().snapshot().items() if not k.endswith("_rate")]
        out = {k: sum(s[k] for s in snaps) for k in keys}
        out["batches"] = max((s["batches"] for s in snaps), default=0)
        rows = max(out["rows"], 1)
        out.update(device_hit_rate=out["device_hits"] / rows, host_hit_rate=out["host_hits"] / rows,
                   miss_rate=out["misses"] / rows)
        return out


class HeteroFeatures:
    """One feature source per node type (a cache over its file, or constants), gathered per batch."""

    def __init__(self, sources: dict[str, FeatureSource]):
        self.sources = dict(sources)
        self.stats = _Totals(tuple(self.sources.values()))

    def new_epoch(self) -> None:
        for s in self.sources.values():
            s.new_epoch()

    def describe(self) -> dict:
        return {t: (s.describe() if hasattr(s, "describe") else {"source": s.name}) for t, s in self.sources.items()}

    def close(self) -> None:
        for s in self.sources.values():
            s.close()


class HeteroPipeline(Pipeline):
    """:class:`~terastack.gnn.pipeline.Pipeline` over heterogeneous batches: a slot holds one tensor per type."""

    def _empty_slot(self):
        return {}

    @staticmethod
    def _slot_bytes(slot) -> int:
        return sum(t.numel() * t.element_size() for t in slot.values())

    def _begin_fill(self, batch: HeteroSampledBatch, k: int) -> Gathering:
        # every type's reads are submitted before any is waited for: they are in the disk's queue together
        slot, begun = self._slots[k], {}
        for t, ids in batch.n_id.items():
            src = self.source.sources[t]
            buf = slot.get(t)
            if buf is None or buf.shape[0] < len(ids):  # grow-only, per type
                buf = slot[t] = torch.empty(int(len(ids) * 1.1) + 1, src.row_len, dtype=src.torch_dtype,
                                            device=self.device)
            begun[t] = src.begin(ids, buf[: len(ids)])
        x = {}

        def finish_all() -> None:
            errors = []
            for t, g in begun.items():  # every one, so no cache keeps a gather in flight after a failure
                try:
                    x[t] = g.finish()
                except BaseException as exc:  # noqa: BLE001 -- the first is raised below
                    errors.append(exc)
            if errors:
                raise errors[0]

        return Gathering(x, finish_all)

    def _data(self, batch: HeteroSampledBatch, x: dict):
        y = self.labels[torch.from_numpy(batch.n_id[batch.target])]
        data = batch.to_hetero_data(x, y.to(self.device, non_blocking=True))
        if self.device.type != "cpu":
            for store in data.edge_stores:
                store.edge_index = store.edge_index.to(self.device, non_blocking=True)
        return data


def hetero_share_budget(ds: HeteroDataset, hot: dict, sampler: HeteroNeighborSampler, *, host_budget: int,
                        device_budget: int) -> tuple[dict, dict]:
    """Per node type (device bytes, host bytes) for its cache, and a description of the split; caches the
    chosen lists in the relations' topologies. See [Note: one budget over node types and relations]."""
    featured = {t: f for t in ds.node_types if (f := ds.node_features(t)) is not None}
    tables = {t: f.num_nodes * (4 if f.num_nodes < 2**31 else 8) for t, f in featured.items()}
    topos = {et: topo for et, topo in ds.topologies.items() if isinstance(topo, SsdTopology)}
    held = sum(topo.memory_bytes for topo in topos.values())  # indptr, where held in memory
    fixed = held + sum(tables.values())
    if host_budget and fixed > host_budget:
        raise ValueError(f"host_cache: {host_budget} bytes cannot hold the fixed part ({fixed} bytes: lookup tables "
                         f"{sum(tables.values())}, indptr in memory {held}); raise host_cache or read indptr from the "
                         "SSD (indptr='ssd')")
    features = {t: FeaturePart(hot[t].counts, f.row_bytes, blocks_per_miss(f.row_bytes) * BLOCK)
                for t, f in featured.items()}
    lists = {et: ListPart(hot[et[2]].expansions, topo.degrees, topo.index_dtype.itemsize,
                          largest_draw(sampler.fanouts[et]), not topo.indptr_in_memory)
             for et, topo in topos.items()}
    host = split_budget_parts(max(0, host_budget - fixed), lists=lists, features=features)
    device = split_budget_parts(device_budget, lists={}, features=features)
    read = 0
    for et, topo in topos.items():
        read += topo.fill(host.lists[et])
    budgets = {}
    lead = ds.target if ds.target in featured else next(iter(featured), None)
    left_host = max(0, host_budget - fixed) - sum(host.list_bytes.values()) - sum(host.feature_bytes.values())
    left_dev = device_budget - sum(device.feature_bytes.values())
    for t in featured:
        dev = device.feature_bytes[t] + (left_dev if t == lead else 0)
        rows = host.feature_bytes[t] + (max(0, left_host) if t == lead else 0)
        budgets[t] = (dev, rows + tables[t] if rows or dev else 0)
    info = {"feature_bytes": {t: host.feature_bytes[t] for t in featured},
            "device_feature_bytes": {t: device.feature_bytes[t] for t in featured},
            "list_bytes": {"___".join(et): b for et, b in host.list_bytes.items()},
            "lists": {"___".join(et): int(len(v)) for et, v in host.lists.items()},
            "saved_bytes": {**{t: v for t, v in host.feature_saved.items()},
                            **{"___".join(et): v for et, v in host.list_saved.items()}},
            "fixed_bytes": fixed, "fill_bytes_read": read}
    return budgets, info


def build_features(ds: HeteroDataset, rankings: dict, budgets: dict, *, device: str = "auto",
                   engine=None) -> HeteroFeatures:
    """Each featured type's :class:`UnifiedCache` (``rankings[t]`` hottest first, ``budgets[t]`` = (device, host)),
    constants for the rest."""
    sources: dict[str, FeatureSource] = {}
    try:
        for t in ds.node_types:
            f = ds.node_features(t)
            if f is None:
                sources[t] = ConstantFeatures()
            else:
                dev, host = budgets.get(t, (0, 0))
                sources[t] = UnifiedCache(f, rankings[t], device_budget=dev, host_budget=host, device=device,
                                          engine=engine)
    except BaseException:
        for s in sources.values():
            s.close()
        raise
    return HeteroFeatures(sources)


class HeteroTrainer:
    """Trains ``sage`` (to_hetero) or ``rgcn`` on a heterogeneous dataset out of core; ``run()`` returns the result."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        data: str
        model: str = "sage"
        hidden: int = 64
        #: one list for every relation ("15,10") or per relation ("cites=15,10;*=5,5"); see parse_hetero_fanouts
        fanouts: object = (15, 10)
        batch_size: int = 1024
        epochs: int = 1
        lr: float = 3e-3
        device_cache: int | str = 0
        host_cache: int | str = "256MiB"
        seed: int = 0
        replace: bool = False
        overlap: bool = True
        depth: int = 1
        #: sampler threads of the pipeline (0: 2 with the topology on the SSD, else 1;
        #: terastack.gnn.pipeline [Note: several sampler threads])
        samplers: int = 0
        #: train, validation and test nodes (each) scored after every epoch (0: none, -1: all)
        eval_nodes: int = 4096
        save_model: str = ""
        presample_epochs: int = 2
        verify: str = "stamp"
        topology: str = "memory"
        indptr: str = "auto"
        device: str = "auto"
        progress: bool = True
        #: with several ranks: gather every rank's parameters after every step and report the largest difference
        check_sync: bool = False

        def __post_init__(self) -> None:
            if not self.data:
                raise ValueError("data: a dataset directory is required")
            if self.model not in HETERO_MODELS:
                raise ValueError(f"model: heterogeneous graphs train one of {', '.join(HETERO_MODELS)}; "
                                 f"got {self.model!r}")
            for name in ("hidden", "batch_size", "depth", "presample_epochs"):
                if getattr(self, name) < 1:
                    raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
            resolve_samplers(self.samplers, None)  # validates
            if self.epochs < 0:
                raise ValueError(f"epochs: must be >= 0, got {self.epochs}")
            if not self.lr > 0:
                raise ValueError(f"lr: must be > 0, got {self.lr}")
            check_read_modes(verify=self.verify, topology=self.topology)
            if self.save_model:
                checkpoint_meta_path(self.save_model)
            self.device_cache = parse_bytes(self.device_cache, field="device_cache")
            self.host_cache = parse_bytes(self.host_cache, field="host_cache")

    def __init__(self, config: "HeteroTrainer.Config", *, engine=None):
        self.config, self.engine = config, engine

    def run(self) -> dict:
        cfg = self.config
        t0 = time.perf_counter()
        ds = open_hetero_dataset(cfg.data, verify=cfg.verify, topology=cfg.topology, indptr=cfg.indptr,
                                 topology_budget=cfg.host_cache, engine=self.engine)
        features, ranks = None, current_ranks()
        try:
            sampler = HeteroNeighborSampler.for_dataset(ds, fanouts=cfg.fanouts, replace=cfg.replace, seed=cfg.seed)
            train_ids = ds.splits["train"]
            if len(train_ids) == 0:
                raise ValueError(f"{ds.root}: the training split of {ds.target!r} is empty")
            opened = time.perf_counter()
            hot = hetero_presample(sampler, train_ids, cfg.batch_size, epochs=cfg.presample_epochs, seed=cfg.seed)
            presampled = time.perf_counter()
            budgets, split = hetero_share_budget(ds, hot, sampler, host_budget=cfg.host_cache,
                                                 device_budget=cfg.device_cache)
            features = build_features(ds, {t: h.order() for t, h in hot.items()}, budgets, device=cfg.device,
                                      engine=self.engine)
            pipeline = HeteroPipeline(sampler, features, ds.labels[ds.target], overlap=cfg.overlap, depth=cfg.depth,
                                      device=cfg.device, rank=ranks.rank, world_size=ranks.world_size,
                                      samplers=resolve_samplers(cfg.samplers, sampler.topology))
            torch.manual_seed(cfg.seed)
            in_dims = {t: ds.feat_dim[t] or 1 for t in ds.node_types}
            model = HeteroGNN(cfg.model, ds.node_types, ds.edge_types, in_dims, cfg.hidden, ds.num_classes,
                              sampler.hops, ds.target).to(pipeline.device)
            net = wrap(model, ranks, pipeline.device)  # data-parallel: terastack.gnn.data_parallel
            sync = SyncCheck(model) if cfg.check_sync and ranks.active else None
            step = checked_step(hetero_train_step, sync)
            optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
            held_out = {name: ds.splits[name] if cfg.eval_nodes < 0 else ds.splits[name][: cfg.eval_nodes]
                        for name in ("train", "val", "test") if cfg.eval_nodes and len(ds.splits[name])}

            def scores() -> dict:
                return {f"{k}_acc": evaluate(pipeline, model, ids, batch_size=cfg.batch_size, step=hetero_eval_step)
                        for k, ids in held_out.items()}

            epochs = []
            for epoch in range(cfg.epochs):
                result = train_epoch(pipeline, net, optimizer, train_ids, batch_size=cfg.batch_size, epoch=epoch,
                                     progress=cfg.progress and ranks.leader, step=step)
                epochs.append({**result, "train_acc": None, "val_acc": None, "test_acc": None, **scores()})
            final = {k: epochs[-1][k] for k in ("train_acc", "val_acc", "test_acc")} if epochs else \
                {"train_acc": None, "val_acc": None, "test_acc": None, **scores()}
            cache_info = features.describe()
            topology_info = {**sampler.topology.describe(), "split": split}
        finally:
            if features is not None:
                features.close()
            ds.close()
        checkpoint = None
        if cfg.save_model and ranks.leader:
            checkpoint = str(save_model(model.cpu(), cfg.save_model, dataset={
                "root": str(ds.root), "nodes": ds.num_nodes, "classes": ds.num_classes, "target": ds.target},
                training={"fanouts": {"___".join(et): list(v) for et, v in sampler.fanouts.items()},
                          "epochs": cfg.epochs, "lr": cfg.lr, "seed": cfg.seed}, **final))
        return {
            "dataset": {"root": str(ds.root), "target": ds.target, "nodes": ds.num_nodes,
                        "edges": {"___".join(et): n for et, n in ds.num_edges.items()},
                        "feat_dim": ds.feat_dim, "verified": ds.verified},
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
            "fanouts": {"___".join(et): list(v) for et, v in sampler.fanouts.items()},
            "cache": cache_info, "topology": topology_info,
            "presample": {"batches": hot[ds.target].batches,
                          "nodes_per_batch": {t: h.nodes_per_batch for t, h in hot.items()}},
            "setup_seconds": {"open": opened - t0, "presample": presampled - opened},
            "epochs": [{k: v for k, v in e.items() if k != "losses"} for e in epochs],
            "loss_curve": [loss for e in epochs for loss in e["losses"]],
            **final, "accuracy": final["test_acc"],
            **{f"{k}_acc_per_epoch": [e[f"{k}_acc"] for e in epochs] for k in ("train", "val", "test")},
            "epoch_seconds": [e["seconds"] for e in epochs], "checkpoint": checkpoint,
            "ranks": {"world_size": ranks.world_size, **(sync.to_dict() if sync else {})},
        }
