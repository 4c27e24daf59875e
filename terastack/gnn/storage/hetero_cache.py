"""A heterogeneous dataset's features: a unified cache per featured node type, constants for the rest."""
from __future__ import annotations

import numpy as np
import torch

from terastack.gnn.storage.cache import FeatureSource, GatherStats, UnifiedCache
from terastack.gnn.storage.hetero_dataset import HeteroDataset


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
