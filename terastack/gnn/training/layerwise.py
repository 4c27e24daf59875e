"""Layer-wise full-graph inference on a homogeneous graph, out of core (the homogeneous kind of
terastack.gnn.training.infer.GnnInference).

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
features through the unified cache of the placement call (ranked by how many
edges leave each node, i.e. how many chunks need the row), one batched SSD read
per chunk for the misses. The last layer writes the logits (``embeddings``) and their argmax
(int64 ``out``): ``.npy`` files numpy can memory-map, each committed atomically
(temporary name beside it, fsync, rename, fsync of the directory).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from terastack.progress import Progress


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


class LayerwiseInference:
    """A homogeneous dataset's predictions, layer by layer; see [Note: layer-wise inference]."""

    default_chunk_nodes = 8192

    def __init__(self, cfg, model, placed):
        """``model`` (a GNN) over a homogeneous dataset placed by terastack.gnn.graph_placement."""
        self.cfg, self.model, self.placed, self.ds = cfg, model, placed, placed.dataset
        if model.config["in_dim"] != self.ds.feat_dim:
            raise ValueError(f"checkpoint: the model takes {model.config['in_dim']} input features; {self.ds.root} "
                             f"has {self.ds.feat_dim} per node")
        self.cache = placed.features.sources[self.ds.target]

    def predict(self, outputs, chunk: int) -> list[dict]:
        """Every layer for every node, chunk by chunk; the last one into ``outputs``. One dict per layer."""
        cfg, ds, mc = self.cfg, self.ds, self.model.config
        widths = [mc["hidden"]] * (mc["num_layers"] - 1) + [mc["out_dim"]]
        dinv = gcn_inverse_sqrt_degrees(ds.indptr, ds.indices, chunk) if mc["kind"] == "gcn" else None
        work_root = Path(cfg.work_dir) if cfg.work_dir else next(iter(outputs.finals.values())).parent
        work_root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".terastack-infer-", dir=work_root))
        bar = Progress(len(widths) * -(-ds.num_nodes // chunk), label="infer", unit="chunks", enabled=cfg.progress)
        layers, prev = [], None
        try:
            for i, (conv, width) in enumerate(zip(self.model.convs, widths)):
                last = i == len(widths) - 1
                path = outputs.temps.get("embeddings", work / "logits.npy") if last else work / f"layer{i}.npy"
                layers.append(self._layer(i, conv, width, prev, path, outputs if last else None, chunk, dinv, bar))
                if prev is not None:
                    prev_path = Path(prev.filename)
                    del prev
                    prev_path.unlink()  # the previous layer's output is consumed
                prev = np.load(path, mmap_mode="r")
            del prev
        finally:
            bar.close()
            shutil.rmtree(work, ignore_errors=True)
        return layers

    def _layer(self, i: int, conv, width: int, prev, path: Path, outputs, chunk: int, dinv, bar) -> dict:
        """Layer ``i``'s output of every node into ``path`` (and the predictions into ``outputs``, if given)."""
        ds, kind, n = self.ds, self.model.config["kind"], self.ds.num_nodes
        t0 = time.perf_counter()
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, width))
        preds = outputs.array("out", (n,), np.int64) if outputs is not None else None
        rows = 0
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            g = chunk_graph(ds.indptr, ds.indices, start, stop)
            if prev is None:
                x = self.cache.gather(g.n_id, torch.empty(len(g.n_id), ds.feat_dim, dtype=self.cache.torch_dtype))
            else:
                x = torch.from_numpy(prev[g.n_id])
            h = layer_forward(kind, conv, x.float(), g, stop - start, dinv)
            if outputs is None:
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
        return {"layer": i, "width": width, "seconds": time.perf_counter() - t0, "rows_read": rows,
                "bytes_written": n * width * 4}
