"""``terastack gnn infer`` on a heterogeneous dataset: full-neighbourhood predictions for every node of the target type.

[Note: heterogeneous inference]
The target's nodes are taken in chunks of consecutive ids; each chunk is sampled with every neighbour
(fanout -1) for as many hops as the model has layers, over every relation
(terastack.gnn.hetero_sampler), its rows gathered through the per-type caches, and the model applied to
the subgraph. That subgraph holds every in-edge of every node whose output the seeds' outputs depend on
(nodes first reached at hop h < L have all their in-edges, added at hop h+1), so the seeds' logits equal
the model's on the whole graph in memory. Unlike the homogeneous layer-wise inference
(terastack.gnn.infer) the cost grows with the L-hop neighbourhood of a chunk: ``chunk_nodes`` bounds the
seeds per subgraph and so its memory. Outputs are ``.npy`` files, each committed atomically: the
predictions (int64, one per target node) and the logits (float32, target nodes x classes).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from terastack.gnn.dataset import check_read_modes
from terastack.gnn.hetero_dataset import open_hetero_dataset
from terastack.gnn.hetero_models import load_hetero_model
from terastack.gnn.hetero_sampler import HeteroNeighborSampler
from terastack.gnn.hetero_train import HeteroPipeline, build_features
from terastack.gnn.infer import check_outputs, commit_file
from terastack.gnn.topology import appearance_counts
from terastack.progress import Progress
from terastack.units import parse_bytes


class HeteroInference:
    """Predictions (and logits) for every target node; see [Note: heterogeneous inference]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        data: str
        checkpoint: str
        out: str = ""
        embeddings: str = ""
        chunk_nodes: int = 1024
        device_cache: int | str = 0
        host_cache: int | str = "256MiB"
        topology: str = "memory"
        verify: str = "stamp"
        progress: bool = True

        def __post_init__(self) -> None:
            if not self.data:
                raise ValueError("data: a dataset directory is required")
            if not self.checkpoint:
                raise ValueError("checkpoint: a model saved by `terastack gnn train --save-model` is required")
            check_outputs(out=self.out, embeddings=self.embeddings)
            if not isinstance(self.chunk_nodes, int) or self.chunk_nodes < 1:
                raise ValueError(f"chunk_nodes: must be an integer >= 1, got {self.chunk_nodes!r}")
            check_read_modes(verify=self.verify, topology=self.topology)
            self.device_cache = parse_bytes(self.device_cache, field="device_cache")
            self.host_cache = parse_bytes(self.host_cache, field="host_cache")

    def __init__(self, config: "HeteroInference.Config", *, engine=None):
        self.config, self.engine = config, engine

    @torch.no_grad()
    def run(self) -> dict:
        cfg = self.config
        started = time.perf_counter()
        model, meta = load_hetero_model(cfg.checkpoint)
        ds = open_hetero_dataset(cfg.data, verify=cfg.verify, topology=cfg.topology, engine=self.engine)
        features = None
        temps: dict[str, Path] = {}
        try:
            mc = model.config
            if sorted(mc["node_types"]) != ds.node_types or sorted(map(tuple, mc["edge_types"])) != ds.edge_types \
                    or mc["target"] != ds.target:
                raise ValueError(f"checkpoint: the model was built for node types {mc['node_types']}, relations "
                                 f"{mc['edge_types']} and target {mc['target']!r}; {ds.root} differs")
            for t in ds.node_types:
                if (ds.feat_dim[t] or 1) != mc["in_dims"][t]:
                    raise ValueError(f"checkpoint: the model takes {mc['in_dims'][t]} features for {t!r}; "
                                     f"{ds.root} has {ds.feat_dim[t] or 1}")
            sampler = HeteroNeighborSampler.for_dataset(ds, fanouts=(-1,) * mc["num_layers"])
            # Rows ranked by how many lists they appear in; the budget divided by each type's share of the bytes.
            degree = {t: np.zeros(n, np.int64) for t, n in ds.num_nodes.items()}
            for et, topo in ds.topologies.items():
                degree[et[0]] += appearance_counts(topo.indices, ds.num_nodes[et[0]])
            sizes = {t: f.num_nodes * f.row_bytes for t in ds.node_types if (f := ds.node_features(t))}
            total = max(sum(sizes.values()), 1)
            budgets = {t: (cfg.device_cache * b // total, cfg.host_cache * b // total) for t, b in sizes.items()}
            features = build_features(ds, {t: np.argsort(-d, kind="stable") for t, d in degree.items()}, budgets,
                                      device="cpu", engine=self.engine)
            pipe = HeteroPipeline(sampler, features, ds.labels[ds.target], overlap=True, device="cpu")
            n, classes = ds.num_nodes[ds.target], mc["out_dim"]
            finals = {name: Path(getattr(cfg, name)) for name in ("out", "embeddings") if getattr(cfg, name)}
            for name, dest in finals.items():
                dest.parent.mkdir(parents=True, exist_ok=True)
                temps[name] = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
            logits = np.lib.format.open_memmap(temps["embeddings"], mode="w+", dtype=np.float32, shape=(n, classes)) \
                if "embeddings" in temps else None
            preds = np.lib.format.open_memmap(temps["out"], mode="w+", dtype=np.int64, shape=(n,)) \
                if "out" in temps else None
            bar = Progress(-(-n // cfg.chunk_nodes), label="infer", unit="chunks", enabled=cfg.progress)
            start = 0
            for data in pipe.epoch(np.arange(n), cfg.chunk_nodes, shuffle=False):
                bs = data[ds.target].batch_size
                h = model(data.x_dict, data.edge_index_dict)[:bs]
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
            del logits, preds
            for name, dest in finals.items():
                commit_file(temps[name], dest)
            cache_info = features.describe()
            reads = features.stats.snapshot()
        finally:
            if features is not None:
                features.close()
            ds.close()
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
        result = {"dataset": {"root": str(ds.root), "target": ds.target, "nodes": ds.num_nodes},
                  "model": mc, "checkpoint": str(cfg.checkpoint), "chunk_nodes": cfg.chunk_nodes,
                  "out": str(finals["out"]) if "out" in finals else None,
                  "embeddings": str(finals["embeddings"]) if "embeddings" in finals else None,
                  "layers": [], "seconds": time.perf_counter() - started, "cache": cache_info,
                  "input_reads": {k: reads[k] for k in ("rows", "device_hit_rate", "host_hit_rate", "miss_rate",
                                                        "ssd_bytes", "ssd_calls")}}
        if "out" in finals:
            preds = np.load(finals["out"], mmap_mode="r")
            labels = ds.labels[ds.target]
            for split in ("val", "test"):
                ids = ds.splits[split]
                result[f"{split}_acc"] = float(np.mean(preds[ids] == labels[ids])) if len(ids) else None
        return result
