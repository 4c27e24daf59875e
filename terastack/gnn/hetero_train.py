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


import numpy as np
import torch

from terastack.constants import BLOCK
from terastack.gnn.cache import FeatureSource, Gathering, GatherStats, UnifiedCache
from terastack.gnn.fanouts import largest_draw
from terastack.gnn.hetero_dataset import HeteroDataset
from terastack.gnn.hetero_sampler import HeteroNeighborSampler, HeteroSampledBatch
from terastack.gnn.pipeline import Pipeline
from terastack.gnn.topology import FeaturePart, ListPart, SsdTopology, split_budget_parts
from terastack.plan.tpc import blocks_per_miss

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
