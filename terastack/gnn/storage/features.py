"""A graph's features, per node type, from one kind of source: the unified cache over each featured type's file
(terastack.gnn.storage.cache), or the baselines' (every row in memory, an ``np.memmap`` held to a budget;
terastack.gnn.storage.baselines); a featureless type gets a constant. A homogeneous graph has one type."""
from __future__ import annotations

import numpy as np
import torch

from terastack.gnn.storage.baselines import InMemoryFeatures, MmapFeatures
from terastack.gnn.storage.cache import FeatureSource, GatherStats, UnifiedCache

#: where the rows of a graph's features come from (:func:`build_features`)
SOURCES = ("cache", "memory", "mmap")


class ConstantFeatures(FeatureSource):
    """A featureless node type's feature: 1.0, width 1 (nothing is read)."""

    name = "constant"
    row_len = 1
    torch_dtype = torch.float32

    def gather(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        out.fill_(1.0)
        self.stats.add(rows=len(ids), host_hits=len(ids), batches=1)
        return out


class TypedFeatures:
    """One feature source per node type, gathered per batch by the pipeline (terastack.gnn.sampling.pipeline)."""

    def __init__(self, sources: dict[str, FeatureSource]):
        self.sources = dict(sources)
        self.stats = self  # the sources' gather statistics together (``stats.snapshot()``, as one source's)

    def snapshot(self) -> dict:
        """Every type's gather statistics summed (a batch counts once)."""
        snaps = [s.stats.snapshot() for s in self.sources.values()]
        out = {k: sum(s[k] for s in snaps) for k in GatherStats().snapshot() if not k.endswith("_rate")}
        out["batches"] = max((s["batches"] for s in snaps), default=0)
        rows = max(out["rows"], 1)
        out.update(device_hit_rate=out["device_hits"] / rows, host_hit_rate=out["host_hits"] / rows,
                   miss_rate=out["misses"] / rows)
        return out

    def new_epoch(self) -> None:
        for s in self.sources.values():
            s.new_epoch()

    def describe(self) -> dict:
        """Each type's source described (the one type's, of a homogeneous graph, at the top too)."""
        parts = {t: (s.describe() if hasattr(s, "describe") else {"source": s.name}) for t, s in self.sources.items()}
        return {**(next(iter(parts.values())) if len(parts) == 1 else {}), "types": parts}

    def close(self) -> None:
        for s in self.sources.values():
            s.close()


def build_features(ds, kind: str = "cache", *, rankings: dict | None = None, budgets: dict | None = None,
                   device: str = "auto", mmap_budget: int | None = None, mmap_threads: int = 1,
                   engine=None) -> TypedFeatures:
    """Every node type's source over the opened dataset ``ds`` (terastack.gnn.storage.dataset): ``kind`` "cache",
    a :class:`UnifiedCache` per featured type (``rankings[t]`` hottest first, ``budgets[t]`` = (device, host)
    bytes); "memory", its rows read into memory; "mmap", an ``np.memmap`` whose page cache is held to
    ``mmap_budget``, shared by the types in proportion to their files. A featureless type: constants."""
    if kind not in SOURCES:
        raise ValueError(f"features: must be one of {', '.join(SOURCES)}; got {kind!r}")
    files = {t: f for t in ds.node_types if (f := ds.node_features(t)) is not None}
    total = max(sum(f.num_nodes * f.row_bytes for f in files.values()), 1)
    sources: dict[str, FeatureSource] = {}
    try:
        for t in ds.node_types:
            f = files.get(t)
            if f is None:
                sources[t] = ConstantFeatures()
            elif kind == "memory":
                sources[t] = InMemoryFeatures(ds.read_type_features(t))
            elif kind == "mmap":
                share = None if mmap_budget is None else mmap_budget * f.num_nodes * f.row_bytes // total
                sources[t] = MmapFeatures(f.features_path, num_rows=f.num_nodes, row_len=f.feat_dim, dtype=f.feat_dtype,
                                          budget=share, threads=mmap_threads)
            else:
                dev, host = budgets.get(t, (0, 0))
                sources[t] = UnifiedCache(f, rankings[t], device_budget=dev, host_budget=host, device=device,
                                          engine=engine)
    except BaseException:
        for s in sources.values():
            s.close()
        raise
    return TypedFeatures(sources)
