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

from terastack.gnn.storage.dataset import DatasetError
from terastack.gnn.formats.hetero_importer import HeteroImporter, HeteroSource, NodeTypeSource, RelationSource
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


def pyg_hetero_source(data, target: str | None = None) -> HeteroSource:
    """A PyG ``HeteroData`` as a :class:`HeteroSource`: ``data[t].x`` (optional), ``data[t].num_nodes``,
    ``data[et].edge_index``; the labels ``y`` and split (masks or index tensors, as for ``Data``) of ``target``
    (default: the only node type with ``y``)."""
    labelled = [t for t in data.node_types if getattr(data[t], "y", None) is not None]
    target = target or (labelled[0] if len(labelled) == 1 else None)
    if target is None or target not in labelled:
        raise DatasetError(f"HeteroData: name the node type to train on (target=...); labelled types: {labelled}")
    node_types, arrays = {}, {}
    for t in data.node_types:
        store = data[t]
        n = store.num_nodes
        if n is None:
            raise DatasetError(f"HeteroData[{t!r}]: the number of nodes is unknown (set num_nodes or x)")
        src = NodeTypeSource(num_nodes=int(n))
        if getattr(store, "x", None) is not None:
            x = _numpy(store.x, f"[{t!r}].x")
            if x.ndim != 2 or x.shape[0] != n or x.dtype.kind not in "fiub":
                raise DatasetError(f"HeteroData[{t!r}].x: features must be a numeric {n} x F matrix, are {x.dtype} "
                                   f"{x.shape}")
            arrays[f"{t}.x"] = x
            src.feat_dim, src.feat_dtype = x.shape[1], x.dtype
            src.feature_blocks = lambda first, rows, x=x: (x[s:s + rows] for s in range(first, len(x), rows))
            src.features_where = f"HeteroData[{t!r}].x"
        if getattr(store, "y", None) is not None:
            y = _numpy(store.y, f"[{t!r}].y")
            arrays[f"{t}.y"] = y
            src.labels = lambda y=y, t=t: labels_from_values(y, f"HeteroData[{t!r}].y")
            src.labels_where = f"HeteroData[{t!r}].y"
        node_types[t] = src
    relations = {}
    for et in data.edge_types:
        ei = _numpy(data[et].edge_index, f"[{et}].edge_index")
        if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
            raise DatasetError(f"HeteroData[{et}].edge_index: must be a 2 x E integer tensor, is {ei.dtype} {ei.shape}")
        arrays["___".join(et)] = ei
        relations[tuple(et)] = RelationSource(
            edge_blocks=lambda first, step, ei=ei: ((ei[0, s:s + step], ei[1, s:s + step])
                                                    for s in range(first, ei.shape[1], step)),
            count_edges=lambda ei=ei: ei.shape[1], where=f"HeteroData[{et}].edge_index")
    splits = _split_of(data[target], None, node_types[target].num_nodes)
    arrays.update({f"{target}.{k}": v for k, (v, _) in splits.items()})
    return HeteroSource(layout="pyg-hetero", target=target, node_types=node_types, relations=relations,
                        splits=lambda _labels: splits, files={"sha256": _digest(arrays)})


def from_pyg(data, out: str | os.PathLike, *, engine=None, target: str | None = None, **kwargs) -> dict:
    """Write a PyG ``Data`` (or a dataset's first graph) or ``HeteroData`` as a terastack dataset in ``out``.

    Keyword arguments are :class:`~terastack.gnn.formats.source.SourceImporter.Config` fields
    (``undirected``, ``dtype``, ``classes``, ``memory_budget``, ``force``, ``progress``). A ``HeteroData``
    becomes a heterogeneous dataset (terastack.gnn.storage.manifest) trained on node type ``target`` (default:
    the only one with labels); ``undirected=True`` adds reverse edges as PyG's ``ToUndirected`` does. Returns
    the import summary (nodes, edges, classes, unlabelled nodes, split sizes).
    """
    kwargs.setdefault("progress", False)
    if hasattr(data, "node_types") and hasattr(data, "edge_types"):
        return HeteroImporter(pyg_hetero_source(data, target), HeteroImporter.Config(out=os.fspath(out), **kwargs),
                              engine=engine).run()
    cfg = SourceImporter.Config(out=os.fspath(out), **kwargs)
    return SourceImporter(pyg_source(data), cfg, engine=engine).run()
