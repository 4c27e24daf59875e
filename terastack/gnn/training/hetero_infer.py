"""Full-neighbourhood predictions for every node of a heterogeneous dataset's target type (the heterogeneous kind
of terastack.gnn.training.infer.GnnInference).

[Note: heterogeneous inference]
The target's nodes are taken in chunks of consecutive ids; each chunk is sampled with every neighbour
(fanout -1) for as many hops as the model has layers, over every relation
(terastack.gnn.sampling.hetero_sampler), its rows gathered through the per-type caches, and the model applied to
the subgraph. That subgraph holds every in-edge of every node whose output the seeds' outputs depend on
(nodes first reached at hop h < L have all their in-edges, added at hop h+1), so the seeds' logits equal
the model's on the whole graph in memory. Unlike the homogeneous layer-wise inference
(terastack.gnn.training.layerwise) the cost grows with the L-hop neighbourhood of a chunk: ``chunk_nodes`` bounds the
seeds per subgraph and so its memory. Outputs are ``.npy`` files, each committed atomically: the
predictions (int64, one per target node) and the logits (float32, target nodes x classes).
"""
from __future__ import annotations

import numpy as np
import torch

from terastack.gnn.sampling.hetero_sampler import HeteroNeighborSampler
from terastack.gnn.sampling.pipeline import HeteroPipeline
from terastack.gnn.storage.hetero_cache import build_features
from terastack.gnn.storage.topology import appearance_counts
from terastack.progress import Progress


class SampledHeteroInference:
    """Predictions (and logits) for every target node; see [Note: heterogeneous inference]."""

    default_chunk_nodes = 1024

    def __init__(self, cfg, model, ds, engine=None):
        """``model`` (a HeteroGNN) over the opened heterogeneous dataset ``ds``, as GnnInference opens them."""
        self.cfg, self.model, self.ds, self.engine = cfg, model, ds, engine
        self.features = None
        self._check()
        self.num_nodes, self.labels = ds.num_nodes[ds.target], ds.labels[ds.target]

    def _check(self) -> None:
        ds, mc = self.ds, self.model.config
        if sorted(mc["node_types"]) != ds.node_types or sorted(map(tuple, mc["edge_types"])) != ds.edge_types \
                or mc["target"] != ds.target:
            raise ValueError(f"checkpoint: the model was built for node types {mc['node_types']}, relations "
                             f"{mc['edge_types']} and target {mc['target']!r}; {ds.root} differs")
        for t in ds.node_types:
            if (ds.feat_dim[t] or 1) != mc["in_dims"][t]:
                raise ValueError(f"checkpoint: the model takes {mc['in_dims'][t]} features for {t!r}; "
                                 f"{ds.root} has {ds.feat_dim[t] or 1}")

    def describe(self) -> dict:
        return {"root": str(self.ds.root), "target": self.ds.target, "nodes": self.ds.num_nodes}

    def _caches(self) -> None:
        """Rows ranked by how many lists they appear in; the budget divided by each type's share of the bytes."""
        cfg, ds = self.cfg, self.ds
        degree = {t: np.zeros(n, np.int64) for t, n in ds.num_nodes.items()}
        for et, topo in ds.topologies.items():
            degree[et[0]] += appearance_counts(topo.indices, ds.num_nodes[et[0]])
        sizes = {t: f.num_nodes * f.row_bytes for t in ds.node_types if (f := ds.node_features(t))}
        total = max(sum(sizes.values()), 1)
        budgets = {t: (cfg.device_cache * b // total, cfg.host_cache * b // total) for t, b in sizes.items()}
        self.features = build_features(ds, {t: np.argsort(-d, kind="stable") for t, d in degree.items()}, budgets,
                                       device="cpu", engine=self.engine)

    def predict(self, outputs, chunk: int) -> list[dict]:
        """The model on each chunk's every-neighbour subgraph, the chunk's rows into ``outputs``."""
        ds, mc = self.ds, self.model.config
        sampler = HeteroNeighborSampler.for_dataset(ds, fanouts=(-1,) * mc["num_layers"])
        self._caches()
        pipe = HeteroPipeline(sampler, self.features, self.labels, overlap=True, device="cpu")
        n = self.num_nodes
        logits = outputs.array("embeddings", (n, mc["out_dim"]), np.float32)
        preds = outputs.array("out", (n,), np.int64)
        bar = Progress(-(-n // chunk), label="infer", unit="chunks", enabled=self.cfg.progress)
        start = 0
        for data in pipe.epoch(np.arange(n), chunk, shuffle=False):
            bs = data[ds.target].batch_size
            with torch.no_grad():
                h = self.model(data.x_dict, data.edge_index_dict)[:bs]
            if logits is not None:
                logits[start:start + bs] = h.numpy()
            if preds is not None:
                preds[start:start + bs] = h.argmax(dim=-1).numpy()
            start += bs
            bar.update(1)
        bar.close()
        for arr in (logits, preds):
            if arr is not None:
                arr.flush()
        return []

    @property
    def cache(self):
        return self.features

    def close(self) -> None:
        if self.features is not None:
            self.features.close()
        self.ds.close()
