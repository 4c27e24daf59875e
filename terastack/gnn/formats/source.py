"""One importer for every on-disk layout: a :class:`GraphSource` says how to stream a dataset's edges,
feature rows, labels and splits; :class:`SourceImporter` writes them into a terastack dataset with the
same resumable, bounded-memory building blocks as ``gen`` and the ``.npy`` importer
(:class:`~terastack.gnn.storage.build.BuildState`, :class:`~terastack.gnn.storage.build.CSCBuilder`,
:class:`~terastack.gnn.storage.build.FeatureWriter`; see [Note: resumable builds]).

Unlabelled nodes: the dataset format stores one class id in ``0..C-1`` per node and has no "missing"
value, so a node a source marks as unlabelled (NaN, an empty CSV field, or a negative id) is stored
with the placeholder class 0 and must not appear in any split -- a split naming one is refused. A
sampled batch only reads the labels of its seed nodes, which all come from a split, so the placeholder
is never trained on or scored. The number of unlabelled nodes is reported.

Memory: edges and feature rows stream in chunks sized from ``memory_budget``; labels (8 bytes per
node while importing) and the splits are held whole, like the CSC builder's O(N) per-node arrays.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from terastack.gnn.storage.build import BuildState, CSCBuilder, FeatureWriter, write_array
from terastack.gnn.storage.manifest import FEATURE_DTYPES, DatasetError, write_manifest
from terastack.progress import Progress
from terastack.units import parse_bytes

SPLITS = ("train_idx", "val_idx", "test_idx")


@dataclass(kw_only=True, slots=True)
class GraphSource:
    """A dataset as streams; made by a layout reader (ogb, igb, a PyG ``Data``) and consumed by SourceImporter."""
    #: layout name recorded in the manifest's origin ("ogb-csv", "ogb-npz", "igb", "pyg")
    layout: str
    num_nodes: int
    feat_dim: int
    #: dtype of the source features ("auto" keeps float16, makes everything else float32)
    feat_dtype: np.dtype
    #: ``(first_edge, max_chunk) -> iterator of (src, dst)`` int arrays, in source order, from edge first_edge
    edge_blocks: Callable[[int, int], Iterator[tuple[np.ndarray, np.ndarray]]]
    #: number of source edges (may read the edge file once; only called when a build starts)
    count_edges: Callable[[], int]
    edges_where: str
    #: ``(first_row, max_rows) -> iterator of row blocks`` of the N x F feature matrix, from row first_row
    feature_blocks: Callable[[int, int], Iterator[np.ndarray]]
    features_where: str
    #: ``() -> int64 [N]``, -1 for an unlabelled node
    labels: Callable[[], np.ndarray]
    labels_where: str
    #: ``labels -> {"train_idx" | "val_idx" | "test_idx": (node ids, where they came from)}``
    splits: Callable[[np.ndarray], dict[str, tuple[np.ndarray, str]]]
    #: source files (path, bytes, mtime) or content digests: resuming with other sources is refused
    files: dict
    #: whether the layout's own loader adds the reverse of every edge (OGB's add_inverse_edge)
    undirected: bool = False
    #: the dataset's published class count, when known (else the largest label + 1)
    num_classes: int | None = None
    #: more facts for the manifest's origin (split rule, label set, dataset name)
    notes: dict = field(default_factory=dict)


def labels_from_values(values: np.ndarray, where, offset: int = 0) -> np.ndarray:
    """Class ids as int64 with -1 for unlabelled (NaN or negative); ``values`` are nodes ``offset``...
    Fractional or infinite values are an error naming ``where`` and the node."""
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise DatasetError(f"{where}: labels must be one class id per node, shape is {values.shape} "
                           "(multi-task / multi-label targets are not supported)")
    if np.issubdtype(values.dtype, np.floating):
        missing = np.isnan(values)
        filled = np.where(missing, -1.0, values)
        frac = filled != np.round(filled)
        if frac.any() or np.isinf(filled).any():
            i = int(np.argmax(frac | np.isinf(filled)))
            raise DatasetError(f"{where}: label of node {offset + i} is {values[i]}, not a class id")
        values = filled
    elif not np.issubdtype(values.dtype, np.integer):
        raise DatasetError(f"{where}: labels must be numbers, dtype is {values.dtype}")
    out = values.astype(np.int64)
    out[out < 0] = -1
    return out


def check_ids(ids: np.ndarray, n: int, where, item: str, offset: int = 0) -> None:
    """Every node id in ``0..n-1``, else a DatasetError naming ``where`` and the ``item`` (edge, entry) number."""
    bad = (ids < 0) | (ids >= n)
    if bad.any():
        i = int(np.argmax(bad))
        raise DatasetError(f"{where}: node id {int(ids[i])} of {item} {offset + i} is out of range "
                           f"(the graph has {n} nodes)")


def checked_classes(labels: dict, classes: int | None) -> int:
    """The class count (``classes``, given or published, else the largest label + 1), every labelled type's labels
    checked against it: ``labels[what] = (labels, node count, where)``, ``what`` naming a node in errors."""
    for what, (lab, n, where) in labels.items():
        if lab.shape != (n,):
            raise DatasetError(f"{where}: labels must have one entry per {what} ({n}), has {lab.shape[0]}")
    classes = classes or max(int(lab.max(initial=-1)) for lab, _, _ in labels.values()) + 1
    for what, (lab, _, where) in labels.items():
        if lab.max(initial=0) >= classes:
            i = int(np.argmax(lab >= classes))
            raise DatasetError(f"{where}: label {int(lab[i])} of {what} {i} is not below classes={classes}")
    return classes


def checked_splits(given: dict, labels: np.ndarray, labels_where: str) -> dict[str, np.ndarray]:
    """The splits a source gives (``key -> (ids, where)``), checked: integer ids in range, every one labelled
    (``labels`` >= 0), a non-empty training split; returned sorted, as int64."""
    n = len(labels)
    out = {}
    for key in SPLITS:
        ids, where = given.get(key, (np.zeros(0, np.int64), ""))
        ids = np.asarray(ids).reshape(-1)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise DatasetError(f"{where}: {key} must hold integer node ids, holds {ids.dtype}")
        ids = ids.astype(np.int64)
        check_ids(ids, n, where, "entry")
        unlabelled = labels[ids] < 0
        if unlabelled.any():
            v = int(ids[np.argmax(unlabelled)])
            raise DatasetError(f"{where}: node {v} is in the {key.split('_')[0]} split but has no label in "
                               f"{labels_where}")
        out[key] = np.sort(ids)
    if len(out["train_idx"]) == 0:
        raise DatasetError(f"{given.get('train_idx', (None, labels_where))[1]}: the training split is empty")
    return out


@dataclass(kw_only=True, slots=True)
class BuildOptions:
    """Options every import shares (a base of the importers' Configs)."""
    #: stored feature dtype ("auto": float16 sources stay float16, everything else becomes float32)
    dtype: str = "auto"
    #: number of classes (None: the dataset's published count, else the largest label + 1)
    classes: int | None = None
    memory_budget: int | str = "1GiB"
    force: bool = False
    progress: bool = True

    def check(self) -> None:
        """Validate the shared fields (a ValueError names the field); called from each Config's __post_init__."""
        if self.dtype not in ("auto",) + FEATURE_DTYPES:
            raise ValueError(f"dtype: must be auto or one of {', '.join(FEATURE_DTYPES)}, got {self.dtype!r}")
        if self.classes is not None and self.classes < 1:
            raise ValueError(f"classes: must be >= 1, got {self.classes}")
        self.memory_budget = parse_bytes(self.memory_budget, field="memory_budget")


@dataclass(kw_only=True, slots=True)
class ImportOptions(BuildOptions):
    """A source importer's options: the shared build options, where to write, and whether to add reverse edges
    (the base of :class:`SourceImporter.Config` and the heterogeneous importer's Config)."""
    out: str
    #: add the reverse of every edge (heterogeneous: under PyG's ``rev_`` relation names, as its ToUndirected
    #: does); None: what the layout's own loader does (OGB's add_inverse_edge)
    undirected: bool | None = None

    def __post_init__(self) -> None:
        if not self.out:
            raise ValueError("out: an output directory is required")
        BuildOptions.check(self)


class SourceImporter:
    """Writes a :class:`GraphSource` into a dataset directory (resumable; see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ImportOptions):
        pass

    def __init__(self, source: GraphSource, config: "SourceImporter.Config", *, engine=None):
        self.source = source
        self.config = config
        self.engine = engine

    def run(self) -> dict:
        src, cfg = self.source, self.config
        started = time.perf_counter()
        n = src.num_nodes
        labels = src.labels()
        classes = checked_classes({"node": (labels, n, src.labels_where)}, cfg.classes or src.num_classes)
        undirected = src.undirected if cfg.undirected is None else cfg.undirected
        dtype = cfg.dtype if cfg.dtype != "auto" else ("float16" if src.feat_dtype == np.float16 else "float32")
        params = {"importer": src.layout, "sources": src.files, "undirected": undirected, "dtype": dtype,
                  "classes": classes, **src.notes}
        state = BuildState(cfg.out, params, force=cfg.force)
        if state.complete:
            return {"out": cfg.out, "status": "already complete", "seconds": 0.0}
        splits = checked_splits(src.splits(labels), labels, src.labels_where)  # checked before anything is written
        write_array(state, "labels", np.maximum(labels, 0).astype(np.int32))
        edges = self._edges(state, undirected)
        write_features(state, src.feature_blocks, num_nodes=n, feat_dim=src.feat_dim, feat_dtype=src.feat_dtype,
                       dtype=dtype, where=src.features_where, options=cfg, engine=self.engine)
        for key in SPLITS:
            write_array(state, key, splits[key])
        write_manifest(cfg.out, num_nodes=n, num_edges=edges, feat_dim=src.feat_dim, feat_dtype=dtype,
                       num_classes=classes, index_dtype="int32" if n < 2**31 else "int64", origin=state.params,
                       engine=self.engine)
        state.finish()
        return {"out": cfg.out, "status": "imported", "layout": src.layout, "nodes": n, "edges": edges,
                "classes": classes, "unlabelled": int((labels < 0).sum()), "undirected": undirected,
                "splits": {k: len(v) for k, v in splits.items()}, "seconds": time.perf_counter() - started}

    def _edges(self, state: BuildState, undirected: bool) -> int:
        src, n = self.source, self.source.num_nodes
        return write_edges(state, src.edge_blocks, src.count_edges, src.edges_where, n_src=n, n_dst=n,
                           mode="both" if undirected else "as_is", options=self.config, label="edges")


def write_edges(state: BuildState, edge_blocks, count_edges, where: str, *, n_src: int, n_dst: int, mode: str,
                options: BuildOptions, label: str) -> int:
    """The CSC of one relation (resumable): the source's ``(src, dst)`` blocks checked (ids below ``n_src`` and
    ``n_dst``) and taken as they are (``mode`` "as_is"), reversed ("reversed": the written relation's sources are
    the source's destinations) or both ways ("both"); returns the edges written."""
    saved = state.progress("edges")
    total = None if ("buckets" in saved or state.done("edges") or state.done("topology")) else count_edges()
    out_src, out_dst = (n_dst, n_src) if mode == "reversed" else (n_src, n_dst)
    builder = CSCBuilder(state, num_nodes=out_dst, num_src=out_src,
                         expected_edges=(total or 0) * (2 if mode == "both" else 1),
                         memory_budget=max(16 << 20, options.memory_budget - 16 * max(n_src, n_dst)),
                         progress=options.progress, drop_self_loops=False)  # imported graphs keep their self-loops
    if not state.done("edges"):
        step = int(max(1 << 16, min(1 << 22, options.memory_budget // 200)))
        pos = builder.extra.get("edges", 0)
        bar = Progress(total, label=label, unit="edges", enabled=options.progress)
        bar.update(pos)
        for s, d in edge_blocks(pos, step):
            s, d = np.asarray(s, np.int64), np.asarray(d, np.int64)
            check_ids(s, n_src, where, "edge", pos)
            check_ids(d, n_dst, where, "edge", pos)
            count = len(s)
            if mode == "reversed":
                s, d = d, s
            elif mode == "both":
                s, d = np.concatenate([s, d]), np.concatenate([d, s])
            pos += count
            builder.add_chunk(s, d, edges=pos)
            bar.update(count)
        bar.close()
        builder.close_edges()
    return builder.build()


def write_features(state: BuildState, feature_blocks, *, num_nodes: int, feat_dim: int, feat_dtype, dtype: str,
                   where: str, options: BuildOptions, engine=None) -> None:
    """A source's feature rows (``feature_blocks(first_row, max_rows)``) written as ``dtype`` (resumable)."""
    from terastack.gnn.formats.streams import RowCursor

    rows = max(1, (4 << 20) // max(1, feat_dim * np.dtype(feat_dtype).itemsize))
    cursor = RowCursor(lambda start: feature_blocks(start, rows), num_nodes, where, "the feature matrix")
    FeatureWriter(state, num_nodes=num_nodes, feat_dim=feat_dim, dtype=dtype,
                  chunk_bytes=max(4 << 20, min(64 << 20, options.memory_budget // 8)), progress=options.progress,
                  engine=engine).write(lambda a, b: cursor.rows(a, b).astype(dtype))
