"""The on-disk heterogeneous GNN dataset: per node type features and labels, per relation CSC topology.

A heterogeneous dataset is a directory::

    manifest.json                             format "terastack-gnn-hetero": node types, relations,
                                              the target type, per file: path, dtype, shape, bytes, checksums
    nodes/<type>/features.bin                 float32|float16 [N_type, F_type], row-major (absent: no features)
    nodes/<type>/labels.bin                   int32 [N_type] (types with labels)
    nodes/<target>/{train,val,test}_idx.bin   int64, sorted ids of the target type
    edges/<src>___<rel>___<dst>/indptr.bin    int64 [N_dst + 1]   the in-neighbours (of type src) of node v of
    edges/<src>___<rel>___<dst>/indices.bin   int32|int64 [E]     type dst: indices[indptr[v]:indptr[v+1]]

Each relation is the homogeneous format's CSC (terastack.gnn.storage.dataset) between two id spaces, so the
sampler, the topology on the SSD and its hot-list cache work per relation unchanged. Files are raw
little-endian bytes (nothing is unpickled); opening checks every file's size against the manifest,
the checksums (the homogeneous format's [Note: verification], stamp included) and the invariants
(indptr monotone from 0 to E, ids below their type's node count, labels below the class count, split
ids labelled). A node type without features gets none stored; the sampler's batches give it a
constant feature of width 1 (PyG's models need an ``x`` per type).

Names of types and relations are letters, digits, ``_`` and ``-`` (no ``___``): they become paths.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from terastack.atomic import atomic_write_json, safe_relative
from terastack.gnn.storage.dataset import FEATURE_DTYPES, INDEX_DTYPES, MANIFEST, FileEntry, GraphDataset, file_entry, need_field, parse_file_entry, read_manifest_json, verify_checksums, write_stamp
from terastack.gnn.storage.invariants import DatasetError, check_csc, check_files, check_ids, check_labels, load_file, map_file
from terastack.gnn.storage.topology import ArrayTopology, SsdTopology, indptr_fits

FORMAT = "terastack-gnn-hetero"
FORMAT_VERSION = 1
SPLIT_KEYS = ("train_idx", "val_idx", "test_idx")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")

EdgeType = tuple[str, str, str]


def check_name(name: str, what: str) -> str:
    """A node type or relation name usable in a path (see the module docstring)."""
    if not isinstance(name, str) or not _NAME.match(name) or "___" in name:
        raise DatasetError(f"{what} {name!r}: names must be letters, digits, '_' and '-' (no '___')")
    return name


def edge_key(edge_type: EdgeType) -> str:
    """``src___rel___dst``: the relation's directory name (OGB's and MAG240M's spelling)."""
    return "___".join(edge_type)


def node_dir(node_type: str) -> str:
    return f"nodes/{node_type}"


def edge_dir(edge_type: EdgeType) -> str:
    return f"edges/{edge_key(edge_type)}"


@dataclass(kw_only=True, slots=True)
class NodeTypeInfo:
    num_nodes: int
    #: 0: no features stored (batches carry a constant feature of width 1)
    feat_dim: int = 0
    feat_dtype: str | None = None
    labelled: bool = False

    def to_dict(self) -> dict:
        return {"num_nodes": self.num_nodes, "feat_dim": self.feat_dim, "feat_dtype": self.feat_dtype,
                "labelled": self.labelled}


@dataclass(kw_only=True, slots=True)
class EdgeTypeInfo:
    num_edges: int
    index_dtype: str

    def to_dict(self) -> dict:
        return {"num_edges": self.num_edges, "index_dtype": self.index_dtype}


def hetero_layout(node_types: dict[str, NodeTypeInfo], edge_types: dict[EdgeType, EdgeTypeInfo], target: str,
                  split_sizes: dict[str, int]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """File key (also its path without ``.bin``) -> (dtype, shape) every file must have."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, info in node_types.items():
        if info.feat_dim:
            out[f"{node_dir(name)}/features"] = (info.feat_dtype, (info.num_nodes, info.feat_dim))
        if info.labelled:
            out[f"{node_dir(name)}/labels"] = ("int32", (info.num_nodes,))
    for key in SPLIT_KEYS:
        out[f"{node_dir(target)}/{key}"] = ("int64", (split_sizes[key],))
    for et, info in edge_types.items():
        out[f"{edge_dir(et)}/indptr"] = ("int64", (node_types[et[2]].num_nodes + 1,))
        out[f"{edge_dir(et)}/indices"] = (info.index_dtype, (info.num_edges,))
    return out


@dataclass(kw_only=True, slots=True)
class HeteroManifest:
    target: str
    num_classes: int
    node_types: dict[str, NodeTypeInfo]
    edge_types: dict[EdgeType, EdgeTypeInfo]
    files: dict[str, FileEntry]
    origin: dict

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": FORMAT_VERSION, "target": self.target, "num_classes": self.num_classes,
                "node_types": {k: v.to_dict() for k, v in self.node_types.items()},
                "edge_types": [{"src": s, "rel": r, "dst": d, **v.to_dict()}
                               for (s, r, d), v in self.edge_types.items()],
                "origin": self.origin, "files": {k: e.to_dict() for k, e in self.files.items()}}

    @classmethod
    def from_dict(cls, data, where: str) -> "HeteroManifest":
        def need(obj, key, kind, ctx=""):
            return need_field(obj, key, kind, ctx, where)

        if need(data, "format", str) != FORMAT:
            raise DatasetError(f"{where}: field format is {data['format']!r}, expected {FORMAT!r}")
        if need(data, "version", int) != FORMAT_VERSION:
            raise DatasetError(f"{where}: field version is {data['version']}, this terastack reads {FORMAT_VERSION}")
        node_types = {}
        for name, raw in sorted(need(data, "node_types", dict).items()):
            ctx = f"node_types.{check_name(name, 'node type')}."
            dim = need(raw, "feat_dim", int, ctx)
            dtype = raw.get("feat_dtype") if isinstance(raw, dict) else None
            if dim and dtype not in FEATURE_DTYPES:
                raise DatasetError(f"{where}: field {ctx}feat_dtype must be one of {FEATURE_DTYPES}, got {dtype!r}")
            node_types[name] = NodeTypeInfo(num_nodes=need(raw, "num_nodes", int, ctx), feat_dim=dim,
                                            feat_dtype=dtype if dim else None,
                                            labelled=bool(need(raw, "labelled", bool, ctx)))
        edge_types = {}
        for i, raw in enumerate(need(data, "edge_types", list)):
            ctx = f"edge_types[{i}]."
            et = tuple(check_name(need(raw, k, str, ctx), "relation part") for k in ("src", "rel", "dst"))
            if et[0] not in node_types or et[2] not in node_types:
                raise DatasetError(f"{where}: field {ctx}: relation {et} names a node type that is not listed")
            dtype = need(raw, "index_dtype", str, ctx)
            if dtype not in INDEX_DTYPES:
                raise DatasetError(f"{where}: field {ctx}index_dtype must be one of {INDEX_DTYPES}, got {dtype!r}")
            if et in edge_types:
                raise DatasetError(f"{where}: field {ctx}: relation {et} is listed twice")
            edge_types[et] = EdgeTypeInfo(num_edges=need(raw, "num_edges", int, ctx), index_dtype=dtype)
        target = need(data, "target", str)
        if target not in node_types or not node_types[target].labelled:
            raise DatasetError(f"{where}: field target {target!r} must be a labelled node type")
        files_raw = need(data, "files", dict)
        files = {key: parse_file_entry(need(files_raw, key, dict, "files."), key, where) for key in files_raw}
        origin = data.get("origin", {})
        return cls(target=target, num_classes=need(data, "num_classes", int), node_types=node_types,
                   edge_types=edge_types, files=files, origin=origin if isinstance(origin, dict) else {})


def write_hetero_manifest(root: str | os.PathLike, *, node_types: dict[str, NodeTypeInfo],
                          edge_types: dict[EdgeType, EdgeTypeInfo], target: str, num_classes: int, origin: dict,
                          engine=None) -> HeteroManifest:
    """Hash every file of a finished heterogeneous build and commit the manifest (the dataset's commit point)."""
    root = Path(root)
    sizes = {k: os.path.getsize(root / f"{node_dir(target)}/{k}.bin") // 8 for k in SPLIT_KEYS}
    files = {key: file_entry(root, key, f"{key}.bin", dtype, shape, engine=engine)
             for key, (dtype, shape) in hetero_layout(node_types, edge_types, target, sizes).items()}
    manifest = HeteroManifest(target=target, num_classes=num_classes, node_types=node_types, edge_types=edge_types,
                              files=files, origin=origin)
    atomic_write_json(root / MANIFEST, manifest.to_dict())
    write_stamp(root, files)
    return manifest


def is_hetero_dataset(root: str | os.PathLike) -> bool:
    """Whether ``root`` holds a finished heterogeneous dataset (its manifest says so)."""
    try:
        return read_manifest_json(Path(root)).get("format") == FORMAT
    except (DatasetError, AttributeError):
        return False


@dataclass(slots=True)
class NodeFeatures:
    """One node type's feature file, in the shape :class:`terastack.gnn.storage.cache.UnifiedCache` reads."""

    num_nodes: int
    feat_dim: int
    feat_dtype: np.dtype
    features_path: Path

    @property
    def row_bytes(self) -> int:
        return self.feat_dim * self.feat_dtype.itemsize


class HeteroDataset:
    """An opened, verified heterogeneous dataset directory (see the module docstring).

    ``topologies[edge_type]`` is the relation's CSC topology: in memory, memory-mapped or on the SSD
    (terastack.gnn.storage.topology), as ``topology`` says; labels and the target's splits are in memory;
    features stay in their files (:meth:`node_features` describes one type's file for the cache).
    """

    #: the homogeneous dataset's settings, one definition for both kinds (root, verify, topology, indptr,
    #: topology_budget)
    Config = GraphDataset.Config

    def __init__(self, config: "HeteroDataset.Config | str | os.PathLike", *, engine=None):
        if not isinstance(config, HeteroDataset.Config):
            config = HeteroDataset.Config(root=os.fspath(config))
        self.config, self.engine = config, engine
        self.root = Path(config.root)
        m = self.manifest = HeteroManifest.from_dict(read_manifest_json(self.root), str(self.root / MANIFEST))
        self.target, self.num_classes = m.target, m.num_classes
        self.node_types = sorted(m.node_types)
        self.edge_types = sorted(m.edge_types)
        self.num_nodes = {t: m.node_types[t].num_nodes for t in self.node_types}
        self.feat_dim = {t: m.node_types[t].feat_dim for t in self.node_types}
        self.paths = {key: safe_relative(self.root, e.path) for key, e in m.files.items()}
        self._check_layout()
        self.verified = verify_checksums(self.root, m.files, self.paths, config.verify, engine=engine)
        self.topologies = self._open_topologies()
        self.labels = {t: self._load(f"{node_dir(t)}/labels") for t in self.node_types if m.node_types[t].labelled}
        self.splits = {k.split("_")[0]: self._load(f"{node_dir(self.target)}/{k}") for k in SPLIT_KEYS}
        self._check_invariants()

    # ------------------------------------------------------------ accessors
    @property
    def num_edges(self) -> dict[EdgeType, int]:
        return {et: self.manifest.edge_types[et].num_edges for et in self.edge_types}

    def node_features(self, node_type: str) -> NodeFeatures | None:
        """The feature file of ``node_type`` (None: the type has no features)."""
        info = self.manifest.node_types[node_type]
        if not info.feat_dim:
            return None
        return NodeFeatures(info.num_nodes, info.feat_dim, np.dtype(info.feat_dtype),
                            self.paths[f"{node_dir(node_type)}/features"])

    def read_features(self, node_type: str) -> np.ndarray:
        """All of ``node_type``'s features in memory (a featureless type: ones of width 1, as batches give it)."""
        f = self.node_features(node_type)
        if f is None:
            return np.ones((self.num_nodes[node_type], 1), np.float32)
        return np.fromfile(f.features_path, dtype=f.feat_dtype).reshape(f.num_nodes, f.feat_dim)

    def __repr__(self) -> str:
        return (f"HeteroDataset({str(self.root)!r}, target={self.target!r}, nodes={self.num_nodes}, "
                f"relations={len(self.edge_types)}, classes={self.num_classes})")

    def close(self) -> None:
        for topo in self.topologies.values():
            topo.close()

    # --------------------------------------------------------------- checks
    def _check_layout(self) -> None:
        m, target = self.manifest, node_dir(self.target)
        sizes = {k: (m.files[f"{target}/{k}"].shape or (-1,))[0] if f"{target}/{k}" in m.files else -1
                 for k in SPLIT_KEYS}
        check_files(self.root / MANIFEST, hetero_layout(m.node_types, m.edge_types, self.target, sizes), m.files,
                    self.paths)

    def _open_topologies(self) -> dict:
        cfg, m = self.config, self.manifest
        out = {}
        # one decision for every relation, on the compact bytes of all of them together
        in_memory = indptr_fits(cfg.indptr, cfg.topology_budget,
                                [(self.num_nodes[et[2]], m.edge_types[et].num_edges) for et in self.edge_types])
        indptr = "memory" if in_memory else "ssd"
        for et in self.edge_types:
            base = edge_dir(et)
            if cfg.topology == "ssd":
                out[et] = SsdTopology(self.paths[f"{base}/indptr"], self.paths[f"{base}/indices"],
                                      num_nodes=self.num_nodes[et[2]], num_edges=m.edge_types[et].num_edges,
                                      index_dtype=m.edge_types[et].index_dtype, indptr=indptr, engine=self.engine)
            else:
                load = self._map if cfg.topology == "mmap" else self._load
                out[et] = ArrayTopology(load(f"{base}/indptr"), load(f"{base}/indices"))
        return out

    def _load(self, key: str) -> np.ndarray:
        return load_file(self.manifest.files[key], self.paths[key], self.engine)

    def _map(self, key: str) -> np.ndarray:
        return map_file(self.manifest.files[key], self.paths[key])

    def _check_invariants(self) -> None:
        # per relation, label array and split: the homogeneous dataset's checks (terastack.gnn.storage.invariants)
        for et in self.edge_types:
            base = edge_dir(et)
            check_csc(self.topologies[et], self.manifest.edge_types[et].num_edges,
                      (self.paths[f"{base}/indptr"], self.paths[f"{base}/indices"]),
                      (self.num_nodes[et[0]], f"type {et[0]!r}"))
        for t, labels in self.labels.items():
            check_labels(labels, self.num_classes, self.paths[f"{node_dir(t)}/labels"])
        n, target = self.num_nodes[self.target], node_dir(self.target)
        for name, ids in self.splits.items():
            check_ids(ids, n, self.paths[f"{target}/{name}_idx"], f"{name} node id", f"type {self.target!r}")


def open_hetero_dataset(root: str | os.PathLike, *, verify: str = "stamp", topology: str = "memory",
                        indptr: str = "auto", topology_budget: int = 0, engine=None) -> HeteroDataset:
    """Open and verify the heterogeneous dataset in ``root``; see :class:`HeteroDataset`."""
    return HeteroDataset(HeteroDataset.Config(root=os.fspath(root), verify=verify, topology=topology, indptr=indptr,
                                              topology_budget=topology_budget), engine=engine)
