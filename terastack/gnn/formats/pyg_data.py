"""``from_pyg``: a ``torch_geometric.data.Data`` (or a PyG dataset: its first graph) as a terastack dataset.

Read from the graph: ``x`` (N x F), ``edge_index`` (2 x E, PyG's source -> target), ``y`` (N or N x 1;
NaN or negative for unlabelled, as ogb's papers100M), and the split as boolean masks
(``train_mask``, ``val_mask``, ``test_mask``) or index tensors (``train_idx``, ``val_idx`` or
``valid_idx``, ``test_idx``); a dataset with ``get_idx_split()`` (ogb's ``PygNodePropPredDataset``)
gives its own split. The graph is already in memory, so only the writing is bounded; a content digest of
the tensors is recorded so a rerun into the same directory resumes or finds the import complete, and a
different graph is refused.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from terastack.gnn.dataset import DatasetError
from terastack.gnn.formats.source import GraphSource, SourceImporter, labels_from_values

MASKS = {"train_idx": ("train_mask", "train_idx"), "val_idx": ("val_mask", "val_idx", "valid_idx"),
         "test_idx": ("test_mask", "test_idx")}


def _numpy(value, what: str) -> np.ndarray:
    if value is None:
        raise DatasetError(f"Data.{what}: the graph has no {what}")
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _digest(arrays: dict[str, np.ndarray]) -> dict:
    out = {}
    for name, arr in arrays.items():
        h = hashlib.sha256(str((arr.dtype.str, arr.shape)).encode())
        h.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
        out[name] = h.hexdigest()
    return out


def _split_of(data, dataset, n: int) -> dict[str, tuple[np.ndarray, str]]:
    if dataset is not None and hasattr(dataset, "get_idx_split"):
        given = dataset.get_idx_split()
        return {k: (_numpy(given[name], f"get_idx_split()[{name!r}]"), f"get_idx_split()[{name!r}]")
                for k, name in (("train_idx", "train"), ("val_idx", "valid"), ("test_idx", "test")) if name in given}
    out = {}
    for key, names in MASKS.items():
        name = next((a for a in names if getattr(data, a, None) is not None), None)
        if name is None:
            continue
        arr = _numpy(getattr(data, name), name)
        if arr.dtype == bool:
            if arr.shape != (n,):
                raise DatasetError(f"Data.{name}: a mask must have one entry per node ({n}), shape is {arr.shape}")
            arr = np.flatnonzero(arr)
        out[key] = (arr, f"Data.{name}")
    if "train_idx" not in out:
        raise DatasetError("Data.train_mask: the graph has no training split (train_mask or train_idx)")
    return out


def pyg_source(data) -> GraphSource:
    """A PyG ``Data`` or dataset as a :class:`GraphSource` (see the module docstring)."""
    dataset = None
    if not hasattr(data, "edge_index") and hasattr(data, "__getitem__"):
        dataset, data = data, data[0]
    x = _numpy(getattr(data, "x", None), "x")
    if x.ndim != 2 or x.dtype.kind not in "fiub":
        raise DatasetError(f"Data.x: features must be a numeric N x F matrix, are {x.dtype} {x.shape}")
    n = x.shape[0]
    ei = _numpy(getattr(data, "edge_index", None), "edge_index")
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise DatasetError(f"Data.edge_index: must be a 2 x E integer tensor, is {ei.dtype} {ei.shape}")
    y = _numpy(getattr(data, "y", None), "y")
    splits = _split_of(data, dataset, n)
    files = _digest({"x": x, "edge_index": ei, "y": y, **{k: v for k, (v, _) in splits.items()}})

    def edge_blocks(first: int, step: int):
        for s in range(first, ei.shape[1], step):
            yield ei[0, s:s + step], ei[1, s:s + step]

    def feature_blocks(first: int, rows: int):
        for s in range(first, n, rows):
            yield x[s:s + rows]

    return GraphSource(layout="pyg", num_nodes=n, feat_dim=x.shape[1], feat_dtype=x.dtype,
                       edge_blocks=edge_blocks, count_edges=lambda: ei.shape[1], edges_where="Data.edge_index",
                       feature_blocks=feature_blocks, features_where="Data.x",
                       labels=lambda: labels_from_values(y, "Data.y"), labels_where="Data.y",
                       splits=lambda _labels: splits, files={"sha256": files})


def from_pyg(data, out: str | os.PathLike, *, engine=None, **kwargs) -> dict:
    """Write a PyG ``Data`` (or a dataset's first graph) as a terastack dataset in ``out``.

    Keyword arguments are :class:`~terastack.gnn.formats.source.SourceImporter.Config` fields
    (``undirected``, ``dtype``, ``classes``, ``memory_budget``, ``force``, ``progress``). Returns the
    import summary (nodes, edges, classes, unlabelled nodes, split sizes).
    """
    kwargs.setdefault("progress", False)
    cfg = SourceImporter.Config(out=os.fspath(out), **kwargs)
    return SourceImporter(pyg_source(data), cfg, engine=engine).run()
