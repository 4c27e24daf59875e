"""``terastack gnn infer``: predictions for every node from a saved model, out of core, either graph kind.

One recipe writes the outputs: the predictions (argmax, int64, one per node of the target type) and the
logits (float32, nodes x classes), ``.npy`` files numpy can memory-map, each committed atomically
(temporary name beside it, fsync, rename, fsync of the directory), and the full-neighbourhood accuracy on
the labelled splits. How the logits are computed is the graph kind's: layer by layer over a homogeneous
graph (terastack.gnn.training.layerwise [Note: layer-wise inference]), or on every-neighbour subgraphs of chunks
of target nodes over a heterogeneous one (terastack.gnn.training.hetero_infer [Note: heterogeneous inference]).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from terastack.gnn.storage.dataset import GraphDataset, open_dataset
from terastack.gnn.storage.hetero_dataset import is_hetero_dataset, open_hetero_dataset
from terastack.gnn.training.hetero_infer import SampledHeteroInference
from terastack.gnn.training.hetero_net import HeteroGNN
from terastack.gnn.training.layerwise import LayerwiseInference
from terastack.gnn.training.models import load_model
from terastack.units import parse_bytes


def commit_file(tmp: Path, dest: Path) -> None:
    """Make a finished .npy file durable under its final name (fsync, rename, fsync the directory)."""
    from terastack.atomic import fsync_dir

    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def check_outputs(*, out: str, embeddings: str) -> None:
    """Raise ValueError naming the field unless at least one of ``out`` and ``embeddings`` is given and each
    given one names a .npy file (homogeneous and heterogeneous inference take the same two outputs)."""
    if not out and not embeddings:
        raise ValueError("out, embeddings: give at least one file to write")
    for name, value in (("out", out), ("embeddings", embeddings)):
        if value and not str(value).endswith(".npy"):
            raise ValueError(f"{name}: must name a .npy file, got {value!r}")


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


def open_inference(cfg, engine=None):
    """The saved model and its dataset, opened once for either graph kind, in the kind's inference
    (:class:`LayerwiseInference` or :class:`SampledHeteroInference`); the checkpoint must be of the dataset's kind."""
    model, _ = load_model(cfg.checkpoint)
    hetero = is_hetero_dataset(cfg.data)
    if hetero != isinstance(model, HeteroGNN):
        kinds = ("homogeneous", "heterogeneous")
        raise ValueError(f"checkpoint: {cfg.checkpoint} holds a {kinds[not hetero]} model; {cfg.data} is a "
                         f"{kinds[hetero]} dataset")
    kind, open_kind = (SampledHeteroInference, open_hetero_dataset) if hetero else (LayerwiseInference, open_dataset)
    ds = open_kind(cfg.data, verify=cfg.verify, topology=cfg.topology, engine=engine)
    try:
        return kind(cfg, model, ds, engine)
    except BaseException:
        ds.close()
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
        device_cache: int | str = 0
        host_cache: int | str = "256MiB"
        #: homogeneous: where the layers' outputs are written between layers (default: beside out / embeddings)
        work_dir: str = ""
        topology: str = "memory"
        verify: str = "stamp"
        progress: bool = True

        def __post_init__(self) -> None:
            if not self.data:
                raise ValueError("data: a dataset directory is required")
            GraphDataset.Config(root=self.data, verify=self.verify, topology=self.topology)  # validates both
            if not self.checkpoint:
                raise ValueError("checkpoint: a model saved by `terastack gnn train --save-model` is required")
            check_outputs(out=self.out, embeddings=self.embeddings)
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
            cache_info = graph.cache.describe()
            reads = graph.cache.stats.snapshot()
        finally:
            graph.close()
            if outputs is not None:
                outputs.discard()
        return {"dataset": graph.describe(), "model": graph.model.config, "checkpoint": str(cfg.checkpoint),
                "chunk_nodes": chunk, **outputs.fields(), "layers": layers,
                "seconds": time.perf_counter() - started, "cache": cache_info,
                "input_reads": {k: reads[k] for k in ("rows", "device_hit_rate", "host_hit_rate", "miss_rate",
                                                      "ssd_bytes", "ssd_calls")},
                **outputs.accuracies(graph.labels, graph.ds.splits)}
