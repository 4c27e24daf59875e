"""``terastack gnn infer``: predictions for every node from a saved model, out of core, either graph kind.

One data path: the placement call (terastack.gnn.graph_placement [Note: one placement call]) opens the dataset,
ranks each type's rows by how many lists they appear in (every row a full-neighbourhood pass reads) and fills
the caches from the one budget; the logits are then computed by the algorithm that applies to the model: layer
by layer for a homogeneous model (terastack.gnn.training.layerwise [Note: layer-wise inference]), or on the
every-neighbour subgraphs of chunks of target nodes for a heterogeneous one ([Note: inference on sampled
subgraphs]). One recipe writes the outputs: the predictions (argmax, int64, one per node of the target type) and
the logits (float32, nodes x classes), ``.npy`` files numpy can memory-map, each committed atomically (temporary
name beside it, fsync, rename, fsync of the directory), and the full-neighbourhood accuracy on the labelled splits.

[Note: inference on sampled subgraphs]
The target's nodes are taken in chunks of consecutive ids; each chunk is sampled with every neighbour (fanout
-1) for as many hops as the model has layers, over every relation, its rows gathered through the caches, and the
model applied to the subgraph through the pipeline (sampling and gathering chunk k+1 while chunk k is computed).
That subgraph holds every in-edge of every node whose output the seeds' outputs depend on (nodes first reached
at hop h < L have all their in-edges, added at hop h+1), so the seeds' logits equal the model's on the whole
graph in memory. Unlike layer-wise inference the cost grows with the L-hop neighbourhood of a chunk:
``chunk_nodes`` bounds the seeds per subgraph and so its memory.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from terastack.atomic import fsync_dir
from terastack.gnn.graph_placement import Placement
from terastack.gnn.settings import setting_default
from terastack.gnn.storage.dataset import GraphDataset
from terastack.gnn.training.train import dataset_report
from terastack.gnn.training.hetero_net import HeteroGNN
from terastack.gnn.training.layerwise import LayerwiseInference
from terastack.gnn.training.models import load_model
from terastack.progress import Progress
from terastack.units import parse_bytes


def commit_file(tmp: Path, dest: Path) -> None:
    """Make a finished .npy file durable under its final name (fsync, rename, fsync the directory)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


class Outputs:
    """The ``out`` and ``embeddings`` files of one run: written under temporary names, committed at the end."""

    def __init__(self, *, out: str, embeddings: str):
        self.finals = {name: Path(value) for name, value in (("out", out), ("embeddings", embeddings)) if value}
        self.temps: dict[str, Path] = {}
        for name, dest in self.finals.items():
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.temps[name] = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")

    def array(self, name: str, shape: tuple, dtype) -> np.memmap | None:
        """The writable temporary array of output ``name``, or None when it is not asked for."""
        if name not in self.temps:
            return None
        return np.lib.format.open_memmap(self.temps[name], mode="w+", dtype=dtype, shape=shape)

    def commit(self) -> None:
        for name, dest in self.finals.items():
            commit_file(self.temps[name], dest)

    def discard(self) -> None:
        for tmp in self.temps.values():
            tmp.unlink(missing_ok=True)

    def fields(self) -> dict:
        return {name: str(self.finals[name]) if name in self.finals else None for name in ("out", "embeddings")}

    def accuracies(self, labels: np.ndarray, splits: dict) -> dict:
        """Accuracy of the committed predictions on the labelled validation and test splits."""
        if "out" not in self.finals:
            return {}
        preds = np.load(self.finals["out"], mmap_mode="r")
        return {f"{split}_acc": float(np.mean(preds[ids] == labels[ids])) if len(ids) else None
                for split in ("val", "test") for ids in (splits[split],)}


class SampledInference:
    """A heterogeneous model's predictions for every target node; see [Note: inference on sampled subgraphs]."""

    default_chunk_nodes = 1024

    def __init__(self, cfg, model, placed: Placement):
        self.cfg, self.model, self.placed, self.ds = cfg, model, placed, placed.dataset
        ds, mc = self.ds, model.config
        if sorted(mc["node_types"]) != ds.node_types or sorted(map(tuple, mc["edge_types"])) != ds.edge_types \
                or mc["target"] != ds.target:
            raise ValueError(f"checkpoint: the model was built for node types {mc['node_types']}, relations "
                             f"{mc['edge_types']} and target {mc['target']!r}; {ds.root} differs")
        for t in ds.node_types:
            if (ds.feature_dims[t] or 1) != mc["in_dims"][t]:
                raise ValueError(f"checkpoint: the model takes {mc['in_dims'][t]} features for {t!r}; "
                                 f"{ds.root} has {ds.feature_dims[t] or 1}")

    def predict(self, outputs, chunk: int) -> list[dict]:
        """The model on each chunk's every-neighbour subgraph, the chunk's rows into ``outputs``."""
        n, out_dim = self.ds.node_counts[self.ds.target], self.model.config["out_dim"]
        logits = outputs.array("embeddings", (n, out_dim), np.float32)
        preds = outputs.array("out", (n,), np.int64)
        bar = Progress(-(-n // chunk), label="infer", unit="chunks", enabled=self.cfg.progress)
        start = 0
        for data in self.placed.pipeline.epoch(np.arange(n), chunk, shuffle=False):
            bs = data[self.ds.target].batch_size
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


def open_inference(cfg, engine=None):
    """The saved model and its dataset, placed once for either graph kind ([Note: inference on sampled subgraphs]
    for a heterogeneous model, layer-wise for a homogeneous one); the checkpoint must be of the dataset's kind."""
    model, _ = load_model(cfg.checkpoint)
    hetero = isinstance(model, HeteroGNN)
    placed = Placement(cfg.data, fanouts=(-1,) * model.config["num_layers"], rank_by="degree", device="cpu",
                       device_cache=cfg.device_cache, host_cache=cfg.host_cache, topology=cfg.topology,
                       verify=cfg.verify, engine=engine)
    try:
        if placed.dataset.hetero != hetero:
            kinds = ("homogeneous", "heterogeneous")
            raise ValueError(f"checkpoint: {cfg.checkpoint} holds a {kinds[hetero]} model; {cfg.data} is a "
                             f"{kinds[placed.dataset.hetero]} dataset")
        return (SampledInference if hetero else LayerwiseInference)(cfg, model, placed)
    except BaseException:
        placed.close()
        raise


class GnnInference:
    """Predictions (and logits) for every node of a dataset's target type from a saved model."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        data: str
        #: weights written by ``terastack gnn train --save-model`` (its description beside them as PATH.json)
        checkpoint: str
        #: predictions (argmax, int64, one per node) as .npy; "" for none
        out: str = ""
        #: the last layer's output (logits, float32, nodes x classes) as .npy; "" for none
        embeddings: str = ""
        #: nodes per chunk (0: 8192 on a homogeneous graph, whose chunk holds their rows and their in-neighbours'
        #: rows; 1024 on a heterogeneous one, whose chunk holds their whole L-hop neighbourhood)
        chunk_nodes: int = 0
        device_cache: int | str = setting_default("cache.device_cache")
        host_cache: int | str = setting_default("cache.host_cache")
        #: homogeneous: where the layers' outputs are written between layers (default: beside out / embeddings)
        work_dir: str = ""
        topology: str = setting_default("data.topology")
        verify: str = setting_default("data.verify")
        progress: bool = True

        def __post_init__(self) -> None:
            if not self.data:
                raise ValueError("data: a dataset directory is required")
            GraphDataset.Config(root=self.data, verify=self.verify, topology=self.topology)  # validates both
            if not self.checkpoint:
                raise ValueError("checkpoint: a model saved by `terastack gnn train --save-model` is required")
            if not self.out and not self.embeddings:
                raise ValueError("out, embeddings: give at least one file to write")
            for name in ("out", "embeddings"):
                if getattr(self, name) and not str(getattr(self, name)).endswith(".npy"):
                    raise ValueError(f"{name}: must name a .npy file, got {getattr(self, name)!r}")
            if self.out and self.embeddings and Path(self.out).resolve() == Path(self.embeddings).resolve():
                raise ValueError("out, embeddings: must be different files")
            if not isinstance(self.chunk_nodes, int) or self.chunk_nodes < 0:
                raise ValueError(f"chunk_nodes: must be an integer >= 1 (0: the graph kind's default), got "
                                 f"{self.chunk_nodes!r}")
            self.device_cache = parse_bytes(self.device_cache, field="device_cache")
            self.host_cache = parse_bytes(self.host_cache, field="host_cache")

    def __init__(self, config: "GnnInference.Config", *, engine=None):
        self.config = config
        self.engine = engine

    @torch.no_grad()
    def run(self) -> dict:
        cfg = self.config
        started = time.perf_counter()
        graph = open_inference(cfg, self.engine)
        chunk = cfg.chunk_nodes or graph.default_chunk_nodes
        outputs = None
        try:
            outputs = Outputs(out=cfg.out, embeddings=cfg.embeddings)
            layers = graph.predict(outputs, chunk)
            outputs.commit()
            cache_info = graph.placed.features.describe()
            reads = graph.placed.features.stats.snapshot()
        finally:
            graph.placed.close()
            if outputs is not None:
                outputs.discard()
        return {"dataset": dataset_report(graph.ds), "model": graph.model.config, "checkpoint": str(cfg.checkpoint),
                "chunk_nodes": chunk, **outputs.fields(), "layers": layers,
                "seconds": time.perf_counter() - started, "cache": cache_info,
                "input_reads": {k: reads[k] for k in ("rows", "device_hit_rate", "host_hit_rate", "miss_rate",
                                                      "ssd_bytes", "ssd_calls")},
                **outputs.accuracies(graph.ds.target_labels, graph.ds.splits)}
