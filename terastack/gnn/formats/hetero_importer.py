"""One importer for every heterogeneous layout: a :class:`HeteroSource` says how to stream each node type's
features and labels and each relation's edges; :class:`HeteroImporter` writes them into a heterogeneous
dataset directory (terastack.gnn.storage.dataset) with the homogeneous import's resumable, bounded-memory
building blocks, one part (a node type or a relation) at a time.

[Note: heterogeneous builds]
Each part is built in its own directory (``nodes/<type>``, ``edges/<src>___<rel>___<dst>``) by a
:class:`~terastack.gnn.storage.build.BuildState` of its own, so the stages of [Note: resumable builds] (labels,
features, splits; edge buckets, CSC) resume within the part; the top-level state records which parts
are finished. Memory is that of the largest part: one node type's labels (8 bytes per node while
importing), one edge chunk or CSC bucket within ``memory_budget``.

Reverse edges (``undirected``), as PyG's ``ToUndirected`` adds them to a ``HeteroData``: a relation
between two types ``(src, rel, dst)`` gains ``(dst, rev_<rel>, src)`` with every edge reversed; a
relation within one type (``paper cites paper``) becomes undirected in place (both directions, duplicates
merged, as ``to_undirected`` coalesces them).
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from terastack.gnn.formats.source import SPLITS, ImportOptions, checked_classes, checked_splits, write_edges, write_features
from terastack.gnn.storage.build import BuildState, write_array
from terastack.gnn.storage.dataset import DatasetError
from terastack.gnn.storage.manifest import EdgeType, EdgeTypeInfo, NodeTypeInfo, check_name, edge_dir, node_dir, write_hetero_manifest


@dataclass(kw_only=True, slots=True)
class NodeTypeSource:
    """One node type of a source: its count, its features (if any) and labels (if any) as streams."""

    num_nodes: int
    feat_dim: int = 0
    feat_dtype: np.dtype | None = None
    #: ``(first_row, max_rows) -> iterator of row blocks`` from row first_row (None: no features)
    feature_blocks: Callable[[int, int], Iterator[np.ndarray]] | None = None
    features_where: str = ""
    #: ``() -> int64 [num_nodes]``, -1 for unlabelled (None: the type has no labels)
    labels: Callable[[], np.ndarray] | None = None
    labels_where: str = ""


@dataclass(kw_only=True, slots=True)
class RelationSource:
    """One relation's edges: ``edge_blocks(first_edge, max_chunk)`` yields (src ids, dst ids) from edge first_edge."""

    edge_blocks: Callable[[int, int], Iterator[tuple[np.ndarray, np.ndarray]]]
    count_edges: Callable[[], int]
    where: str


@dataclass(kw_only=True, slots=True)
class HeteroSource:
    """A heterogeneous dataset as streams; made by a layout reader, consumed by :class:`HeteroImporter`."""

    layout: str
    #: the labelled node type the splits are of (the one trained and scored)
    target: str
    node_types: dict[str, NodeTypeSource]
    relations: dict[EdgeType, RelationSource]
    #: ``target labels -> {"train_idx" | "val_idx" | "test_idx": (ids, where they came from)}``
    splits: Callable[[np.ndarray], dict]
    files: dict
    #: whether the layout's own loader adds reverse edges
    undirected: bool = False
    num_classes: int | None = None
    notes: dict = field(default_factory=dict)


def output_relations(relations, undirected: bool) -> dict[EdgeType, tuple[EdgeType, str]]:
    """Relation written -> (source relation, how its edges are taken: "as_is", "reversed" or "both").

    See [Note: heterogeneous builds] for the reverse edges ``undirected`` adds.
    """
    out: dict[EdgeType, tuple[EdgeType, str]] = {}
    for et in sorted(relations):
        src, rel, dst = et
        if not undirected:
            out[et] = (et, "as_is")
        elif src == dst:
            out[et] = (et, "both")
        else:
            out[et] = (et, "as_is")
            rev = (dst, f"rev_{rel}", src)
            if rev in relations or rev in out:
                raise DatasetError(f"relation {rev}: the source already has it, so reverse edges cannot be added "
                                   "under PyG's name; import without --undirected")
            out[rev] = (et, "reversed")
    return dict(sorted(out.items()))


class HeteroImporter:
    """Writes a :class:`HeteroSource` into a heterogeneous dataset directory; see [Note: heterogeneous builds]."""

    @dataclass(kw_only=True, slots=True)
    class Config(ImportOptions):
        pass

    def __init__(self, source: HeteroSource, config: "HeteroImporter.Config", *, engine=None):
        self.source, self.config, self.engine = source, config, engine

    def run(self) -> dict:
        src, cfg = self.source, self.config
        started = time.perf_counter()
        for name in src.node_types:
            check_name(name, "node type")
        for et in src.relations:
            for part in et:
                check_name(part, "relation part")
            for t in (et[0], et[2]):
                if t not in src.node_types:
                    raise DatasetError(f"{src.relations[et].where}: relation {et} names node type {t!r}, which has "
                                       "no node count")
        target = src.node_types.get(src.target)
        if target is None or target.labels is None:
            raise DatasetError(f"target {src.target!r}: the node type to train on must exist and have labels")
        undirected = src.undirected if cfg.undirected is None else cfg.undirected
        written = output_relations(src.relations, undirected)
        labels = {t: s.labels() for t, s in src.node_types.items() if s.labels is not None}
        classes = checked_classes({f"{t} node": (lab, src.node_types[t].num_nodes, src.node_types[t].labels_where)
                                   for t, lab in labels.items()}, cfg.classes or src.num_classes)
        splits = checked_splits(src.splits(labels[src.target]), labels[src.target], target.labels_where)
        dtypes = {t: self._dtype(s) for t, s in src.node_types.items()}
        params = {"importer": src.layout, "sources": src.files, "undirected": undirected, "classes": classes,
                  "dtype": cfg.dtype, "target": src.target, **src.notes}
        state = BuildState(cfg.out, params, force=cfg.force)
        if state.complete:
            return {"out": cfg.out, "status": "already complete", "seconds": 0.0}
        if cfg.force or not state.resumed:  # parts of another build must not be taken for this one's
            for sub in ("nodes", "edges"):
                shutil.rmtree(Path(cfg.out) / sub, ignore_errors=True)
        for t, s in src.node_types.items():
            self._part(state, node_dir(t), lambda part, t=t, s=s: self._node_type(
                part, s, dtypes[t], labels.get(t), splits if t == src.target else None))
        edges = {}
        for et, (from_et, mode) in written.items():
            edges[et] = self._part(state, edge_dir(et), lambda part, et=et, f=from_et, m=mode: self._relation(
                part, src.relations[f], src.node_types[f[0]].num_nodes, src.node_types[f[2]].num_nodes, m))
        node_info = {t: NodeTypeInfo(num_nodes=s.num_nodes, feat_dim=s.feat_dim if s.feature_blocks else 0,
                                     feat_dtype=dtypes[t], labelled=t in labels) for t, s in src.node_types.items()}
        index = {et: "int32" if max(src.node_types[et[0]].num_nodes, src.node_types[et[2]].num_nodes) < 2**31
                 else "int64" for et in written}
        write_hetero_manifest(cfg.out, node_types=node_info,
                              edge_types={et: EdgeTypeInfo(num_edges=edges[et], index_dtype=index[et]) for et in written},
                              target=src.target, num_classes=classes, origin=state.params, engine=self.engine)
        state.finish()
        return {"out": cfg.out, "status": "imported", "layout": src.layout, "target": src.target,
                "nodes": {t: s.num_nodes for t, s in src.node_types.items()},
                "edges": {edge_dir(et)[6:]: n for et, n in edges.items()}, "classes": classes,
                "unlabelled": int((labels[src.target] < 0).sum()), "undirected": undirected,
                "splits": {k: len(v) for k, v in splits.items()}, "seconds": time.perf_counter() - started}

    def _dtype(self, s: NodeTypeSource) -> str | None:
        if s.feature_blocks is None:
            return None
        if self.config.dtype != "auto":
            return self.config.dtype
        return "float16" if s.feat_dtype == np.float16 else "float32"

    def _part(self, state: BuildState, name: str, build) -> int:
        """Build one part in its own directory (resumably), once; returns what ``build`` returns (edge count)."""
        if state.done(name):
            return state.progress(name).get("result", 0)
        part = BuildState(Path(state.root) / name, {**state.params, "part": name})
        result = int(build(part) or 0)
        state.commit(name, done=True, result=result)
        part.finish()
        return result

    def _node_type(self, part: BuildState, s: NodeTypeSource, dtype, labels, splits) -> None:
        if labels is not None:
            write_array(part, "labels", np.maximum(labels, 0).astype(np.int32))
        if s.feature_blocks is not None:
            write_features(part, s.feature_blocks, num_nodes=s.num_nodes, feat_dim=s.feat_dim, feat_dtype=s.feat_dtype,
                           dtype=dtype, where=s.features_where, options=self.config, engine=self.engine)
        if splits is not None:
            for key in SPLITS:
                write_array(part, key, splits[key])

    def _relation(self, part: BuildState, rel: RelationSource, n_src: int, n_dst: int, mode: str) -> int:
        """CSC of one written relation: the source's edges as they are, reversed, or both ways."""
        return write_edges(part, rel.edge_blocks, rel.count_edges, rel.where, n_src=n_src, n_dst=n_dst, mode=mode,
                           options=self.config, label=f"edges {rel.where}")
