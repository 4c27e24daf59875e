"""``terastack gnn infer``: layer-wise full-graph inference out of core.

[Note: layer-wise inference]
Running an L-layer model node by node over full neighbourhoods needs each
node's L-hop neighbourhood, which on a power-law graph is most of the graph.
Layer-wise inference computes layer l's output for *every* node from layer
l-1's output, in chunks of consecutive destination nodes D:

    for layer l:         for chunk D:  rows  = D + in-neighbours(D)   (one CSC slice)
                                       x     = layer l-1's output of rows
                                       out_l[D] = conv_l(x, every in-edge of D)[: |D|]

The conv is the model's own PyG module. Its output for D is exact because
SAGE's mean, GAT's attention softmax and GCN's weighted sum over a node's
in-edges see all of them; only the rows outside D (in-neighbours whose own
in-edges are missing) come out wrong, and they are dropped. GCN's weights also
need the degree of every *source* node, which the chunk does not have: they are
computed from the full graph's in-degrees exactly as PyG's ``gcn_norm`` does
(``add_remaining_self_loops``: existing self-loops dropped, one of weight 1 per
node; ``deg^-1/2`` at both ends), and the conv runs on them with its own
normalisation switched off for the call.

Memory holds one chunk's rows. Layer l's output (nodes x width, float32) is
written to a ``.npy`` memory map in the work directory (default: beside the
output) and streamed back as the next layer's input; layer 0 reads the input
features through the unified cache (ranked by how many edges leave each node,
i.e. how many chunks need the row), one batched SSD read per chunk for the
misses. The last layer writes the logits (``embeddings``) and their argmax
(int64 ``out``): ``.npy`` files numpy can memory-map, each committed atomically
(temporary name beside it, fsync, rename, fsync of the directory).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from terastack.gnn.cache import UnifiedCache
from terastack.gnn.dataset import GraphDataset, open_dataset
from terastack.gnn.models import load_model
from terastack.progress import Progress
from terastack.units import parse_bytes


@dataclass(slots=True)
class ChunkGraph:
    """The in-edges of destination nodes ``start..stop-1`` with local ids: ``n_id[:stop-start]`` is the chunk."""

    n_id: np.ndarray
    #: global ids of each edge's source and destination (CSC order)
    src: np.ndarray
    dst: np.ndarray
    #: local ids (positions in ``n_id``) of the same edges
    src_local: np.ndarray
    dst_local: np.ndarray


def chunk_graph(indptr: np.ndarray, indices: np.ndarray, start: int, stop: int) -> ChunkGraph:
    """Every in-edge of nodes ``start..stop-1`` (one contiguous CSC slice) and the rows they need."""
    lo, hi = int(indptr[start]), int(indptr[stop])
    src = np.asarray(indices[lo:hi], dtype=np.int64)
    count = stop - start
    dst_local = np.repeat(np.arange(count, dtype=np.int64), np.diff(np.asarray(indptr[start: stop + 1], np.int64)))
    inside = (src >= start) & (src < stop)
    outside = np.unique(src[~inside])
    n_id = np.concatenate([np.arange(start, stop, dtype=np.int64), outside])
    src_local = np.where(inside, src - start, count + np.searchsorted(outside, src))
    return ChunkGraph(n_id=n_id, src=src, dst=dst_local + start, src_local=src_local, dst_local=dst_local)


def gcn_inverse_sqrt_degrees(indptr: np.ndarray, indices: np.ndarray, chunk_nodes: int) -> torch.Tensor:
    """``deg^-1/2`` of every node as PyG's ``gcn_norm`` computes it on the whole graph (float32).

    ``add_remaining_self_loops`` drops a node's self-loop and adds one of weight 1, so a node's degree is
    its in-edges other than a self-loop, plus 1 (never 0).
    """
    n = len(indptr) - 1
    loops = np.zeros(n, np.int64)
    for start in range(0, n, chunk_nodes):  # self-loops, one CSC slice at a time
        stop = min(n, start + chunk_nodes)
        lo, hi = int(indptr[start]), int(indptr[stop])
        dst = np.repeat(np.arange(start, stop), np.diff(np.asarray(indptr[start: stop + 1], np.int64)))
        loops += np.bincount(dst[np.asarray(indices[lo:hi]) == dst], minlength=n)
    deg = torch.from_numpy((np.diff(np.asarray(indptr, np.int64)) - loops + 1).astype(np.float32))
    return deg.pow_(-0.5)


@contextmanager
def _normalisation_off(conv):
    """Run a GCNConv on weights normalised by the caller (it adds no self-loops either, then)."""
    conv.normalize = False
    try:
        yield
    finally:
        conv.normalize = True


def layer_forward(kind: str, conv, x: torch.Tensor, g: ChunkGraph, count: int,
                  dinv: torch.Tensor | None = None) -> torch.Tensor:
    """The conv's output for the chunk's ``count`` destination nodes (the first rows of ``g.n_id``).

    ``dinv``: for ``gcn``, :func:`gcn_inverse_sqrt_degrees` of the whole graph.
    """
    if kind != "gcn":
        return conv(x, torch.from_numpy(np.stack([g.src_local, g.dst_local])))[:count]
    keep = g.src != g.dst  # as add_remaining_self_loops: the graph's self-loops go, one per node comes back
    loops = np.arange(count)
    rows = np.concatenate([g.src_local[keep], loops])
    cols = np.concatenate([g.dst_local[keep], loops])
    src = torch.from_numpy(np.concatenate([g.src[keep], g.n_id[:count]]))
    dst = torch.from_numpy(np.concatenate([g.dst[keep], g.n_id[:count]]))
    weight = dinv[src] * dinv[dst]
    with _normalisation_off(conv):
        return conv(x, torch.from_numpy(np.stack([rows, cols])), weight)[:count]


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


class GnnInference:
    """Predictions (and logits) for every node of a dataset from a saved model; see [Note: layer-wise inference]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        data: str
        #: weights written by ``terastack gnn train --save-model`` (its description beside them as PATH.json)
        checkpoint: str
        #: predictions (argmax, int64, one per node) as .npy; "" for none
        out: str = ""
        #: the last layer's output (logits, float32, nodes x classes) as .npy; "" for none
        embeddings: str = ""
        #: destination nodes per chunk (memory: their rows plus their in-neighbours' rows)
        chunk_nodes: int = 8192
        device_cache: int | str = 0
        host_cache: int | str = "256MiB"
        #: where the layers' outputs are written between layers (default: beside out / embeddings)
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
            if not isinstance(self.chunk_nodes, int) or self.chunk_nodes < 1:
                raise ValueError(f"chunk_nodes: must be an integer >= 1, got {self.chunk_nodes!r}")
            self.device_cache = parse_bytes(self.device_cache, field="device_cache")
            self.host_cache = parse_bytes(self.host_cache, field="host_cache")

    def __init__(self, config: "GnnInference.Config", *, engine=None):
        self.config = config
        self.engine = engine

    @torch.no_grad()
    def run(self) -> dict:
        cfg = self.config
        started = time.perf_counter()
        model, meta = load_model(cfg.checkpoint)
        ds = open_dataset(cfg.data, verify=cfg.verify, topology=cfg.topology, engine=self.engine)
        mc = model.config
        if mc["in_dim"] != ds.feat_dim:
            raise ValueError(f"checkpoint: the model takes {mc['in_dim']} input features; {ds.root} has "
                             f"{ds.feat_dim} per node")
        n, chunk = ds.num_nodes, cfg.chunk_nodes
        widths = [mc["hidden"]] * (mc["num_layers"] - 1) + [mc["out_dim"]]
        dinv = gcn_inverse_sqrt_degrees(ds.indptr, ds.indices, chunk) if mc["kind"] == "gcn" else None
        finals = {name: Path(getattr(cfg, name)) for name in ("out", "embeddings") if getattr(cfg, name)}
        for dest in finals.values():
            dest.parent.mkdir(parents=True, exist_ok=True)
        work_root = Path(cfg.work_dir) if cfg.work_dir else next(iter(finals.values())).parent
        work_root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".terastack-infer-", dir=work_root))
        temps = {name: dest.with_name(f".{dest.name}.tmp-{os.getpid()}") for name, dest in finals.items()}
        # Layer 0's rows come through the unified cache, hottest first: the nodes most edges leave from.
        ranking = np.argsort(-ds.topology.appearance_counts(), kind="stable")
        cache = UnifiedCache(ds, ranking, device_budget=cfg.device_cache, host_budget=cfg.host_cache, device="cpu",
                             engine=self.engine)
        bar = Progress(len(widths) * -(-n // chunk), label="infer", unit="chunks", enabled=cfg.progress)
        layers = []
        try:
            prev = None
            for i, (conv, width) in enumerate(zip(model.convs, widths)):
                t0 = time.perf_counter()
                last = i == len(widths) - 1
                path = temps.get("embeddings", work / "logits.npy") if last else work / f"layer{i}.npy"
                out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, width))
                preds = np.lib.format.open_memmap(temps["out"], mode="w+", dtype=np.int64, shape=(n,)) \
                    if last and "out" in temps else None
                rows = 0
                for start in range(0, n, chunk):
                    stop = min(n, start + chunk)
                    g = chunk_graph(ds.indptr, ds.indices, start, stop)
                    if prev is None:
                        x = cache.gather(g.n_id, torch.empty(len(g.n_id), ds.feat_dim, dtype=cache.torch_dtype))
                    else:
                        x = torch.from_numpy(prev[g.n_id])
                    h = layer_forward(mc["kind"], conv, x.float(), g, stop - start, dinv)
                    if not last:
                        h = F.relu(h)
                    out[start:stop] = h.numpy()
                    if preds is not None:
                        preds[start:stop] = h.argmax(dim=-1).numpy()
                    rows += len(g.n_id)
                    bar.update(1, layer=i)
                out.flush()
                if preds is not None:
                    preds.flush()
                del out, preds
                if prev is not None:
                    prev_path = Path(prev.filename)
                    del prev
                    prev_path.unlink()  # the previous layer's output is consumed
                prev = np.load(path, mmap_mode="r")
                layers.append({"layer": i, "width": width, "seconds": time.perf_counter() - t0,
                               "rows_read": rows, "bytes_written": n * width * 4})
            del prev
            for name, dest in finals.items():
                commit_file(temps[name], dest)
            cache_info = cache.describe()
            ssd = cache.stats.snapshot()
        finally:
            bar.close()
            cache.close()
            ds.close()
            shutil.rmtree(work, ignore_errors=True)
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
        result = {
            "dataset": {"root": str(ds.root), "nodes": n, "edges": ds.num_edges, "feat_dim": ds.feat_dim},
            "model": mc, "checkpoint": str(cfg.checkpoint), "chunk_nodes": chunk,
            "out": str(finals["out"]) if "out" in finals else None,
            "embeddings": str(finals["embeddings"]) if "embeddings" in finals else None,
            "layers": layers, "seconds": time.perf_counter() - started, "cache": cache_info,
            "input_reads": {k: ssd[k] for k in ("rows", "device_hit_rate", "host_hit_rate", "miss_rate", "ssd_bytes",
                                                "ssd_calls")},
        }
        if "out" in finals:  # accuracy of the full-neighbourhood predictions on the labelled splits
            preds = np.load(finals["out"], mmap_mode="r")
            for split in ("val", "test"):
                ids = ds.splits[split]
                result[f"{split}_acc"] = float(np.mean(preds[ids] == ds.labels[ids])) if len(ids) else None
        return result
