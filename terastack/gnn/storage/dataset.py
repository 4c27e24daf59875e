"""The on-disk GNN dataset of either kind, opened as one typed graph (the formats: terastack.gnn.storage.manifest).

[Note: one typed graph]
A dataset is node types, relations ``(src, rel, dst)`` between them, and a target type whose nodes are
labelled and split; a homogeneous dataset is the one-type, one-relation case (type ``node``, relation
``node to node``). Which kind a directory holds is read from its manifest's format when it is opened
(:func:`open_dataset`), and nowhere else: everything above (sampling, pre-sampling, the budget split, the
feature caches, the pipeline, training and inference) reads the typed view -- ``node_types``,
``edge_types``, ``target``, ``node_counts``, ``topologies``, :meth:`GraphDataset.node_features`,
``target_labels``, ``splits`` -- and ``hetero`` only where a result is worded (a homogeneous batch is a PyG
``Data``, a heterogeneous one a ``HeteroData``). A homogeneous dataset also answers to its one type's names
(``num_nodes``, ``feat_dim``, ``indptr``, ``labels``, ...).

[Note: verification]
Opening a dataset checks the manifest's fields, that every file exists with exactly the size the manifest
states (a truncated file is an error naming it), and the structural invariants per relation (indptr
monotone from 0 to E, indices and split ids in range, labels below the class count). Content checksums
(SHA-256 per 64 MiB chunk) are checked in full the first time; a successful full check writes a stamp
(``.verified.json``) keyed to each file's size, inode, mtime and ctime and to the manifest's own hash, so
later opens of an unchanged dataset skip the re-hash. Any write to a file changes its ctime, which
invalidates the stamp. ``verify="full"`` always re-hashes (use it after copying a dataset between
machines); ``verify="size"`` skips checksums and says so in ``verified``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from terastack.atomic import safe_relative
from terastack.gnn.storage.invariants import DatasetError, check_csc, check_files, check_ids, check_labels, load_file, map_file
from terastack.gnn.storage.manifest import MANIFEST, SPLIT_KEYS, read_manifest, verify_checksums
from terastack.gnn.storage.topology import INDPTR_MODES, ArrayTopology, SsdTopology, indptr_fits

__all__ = ["DatasetError", "GraphDataset", "NodeFeatures", "open_dataset"]

VERIFY_MODES = ("stamp", "full", "size")
TOPOLOGY_MODES = ("memory", "mmap", "ssd")
#: a homogeneous dataset's names of its one type (absent on a heterogeneous one)
_ONE_TYPE = ("num_nodes", "num_edges", "feat_dim", "feat_dtype", "row_bytes", "topology", "indptr", "indices",
             "labels", "features_path", "feature_bytes")


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


class GraphDataset:
    """An opened, verified dataset directory of either kind; see [Note: one typed graph].

    Each relation's topology is loaded into host memory (``topology="memory"``), memory-mapped (``"mmap"``) or
    left in its files and read through the storage engine (``"ssd"``: a
    :class:`terastack.gnn.storage.topology.SsdTopology`); the target's labels and splits are loaded into memory;
    features stay on disk and are read by row extents (:class:`terastack.gnn.storage.cache.UnifiedCache`).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        root: str
        #: "stamp" (full hash unless an unchanged, already verified dataset), "full", or "size"
        verify: str = "stamp"
        #: "memory": read indptr/indices into RAM; "mmap": map them (pages come from disk on demand);
        #: "ssd": leave them in their files, read through the storage engine per hop (terastack.gnn.storage.topology)
        topology: str = "memory"
        #: with topology="ssd": indptr in RAM ("memory"), on the SSD ("ssd"), or "auto" (RAM when the compact form
        #: of every relation's indptr together costs at most a quarter of ``topology_budget``)
        indptr: str = "auto"
        #: with topology="ssd": the memory the topology may hold (bytes), which "auto" weighs indptr against
        topology_budget: int = 0

        def __post_init__(self) -> None:
            if not self.root:
                raise ValueError("root: the dataset directory is required")
            for name, allowed in (("verify", VERIFY_MODES), ("topology", TOPOLOGY_MODES), ("indptr", INDPTR_MODES)):
                if getattr(self, name) not in allowed:
                    raise ValueError(f"{name}: must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
            if self.topology_budget < 0:
                raise ValueError(f"topology_budget: must be >= 0, got {self.topology_budget}")

    def __init__(self, config: "GraphDataset.Config | str | os.PathLike", *, engine=None):
        if not isinstance(config, GraphDataset.Config):
            config = GraphDataset.Config(root=os.fspath(config))
        self.config, self.engine = config, engine
        self.root = Path(config.root)
        m = self.manifest = read_manifest(self.root)
        self.hetero = m.hetero  # the graph kind, read from the format: [Note: one typed graph]
        self.target, self.num_classes = m.target, m.num_classes
        self.node_types, self.edge_types = sorted(m.node_types), sorted(m.edge_types)
        self.node_counts = {t: m.node_types[t].num_nodes for t in self.node_types}
        self.edge_counts = {et: m.edge_types[et].num_edges for et in self.edge_types}
        self.feature_dims = {t: m.node_types[t].feat_dim for t in self.node_types}
        self.paths = {key: safe_relative(self.root, e.path) for key, e in m.files.items()}
        node = m.node_types[self.target]
        context = "" if self.hetero else (f" for {node.num_nodes} nodes, {sum(self.edge_counts.values())} edges, "
                                          f"{node.feat_dim} features")
        check_files(self.root / MANIFEST, m.layout(), m.files, self.paths, context)
        self.verified = verify_checksums(self.root, m.files, self.paths, config.verify, engine=engine)
        self.topologies = self._open_topologies()
        labels = {t: self._load(m.labels_key(t)) for t in self.node_types if m.node_types[t].labelled}
        self.target_labels = labels[self.target]
        self.splits = {k[:-4]: self._load(m.split_key(k[:-4])) for k in SPLIT_KEYS}
        self._check_invariants(labels)
        if not self.hetero:
            self._name_the_one_type()

    # ------------------------------------------------------------ the typed view
    def node_features(self, node_type: str) -> NodeFeatures | None:
        """The feature file of ``node_type`` (None: the type has no features)."""
        info = self.manifest.node_types[node_type]
        if not info.feat_dim:
            return None
        return NodeFeatures(info.num_nodes, info.feat_dim, np.dtype(info.feat_dtype),
                            self.paths[self.manifest.features_key(node_type)])

    def read_type_features(self, node_type: str) -> np.ndarray:
        """All of ``node_type``'s features in memory (a featureless type: ones of width 1, as batches give it)."""
        f = self.node_features(node_type)
        if f is None:
            return np.ones((self.node_counts[node_type], 1), np.float32)
        return _read_rows(f, 0, f.num_nodes, self.engine)

    def __repr__(self) -> str:
        if self.hetero:
            return (f"GraphDataset({str(self.root)!r}, target={self.target!r}, nodes={self.node_counts}, "
                    f"relations={len(self.edge_types)}, classes={self.num_classes})")
        return (f"GraphDataset({str(self.root)!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"features={self.feat_dim}x{self.feat_dtype.name}, classes={self.num_classes})")

    def close(self) -> None:
        """Close the topologies' files (``topology="ssd"``); arrays in memory are left to the collector."""
        for topo in self.topologies.values():
            topo.close()

    # ------------------------------------------------------------ a homogeneous dataset's one type
    def _name_the_one_type(self) -> None:
        (et,) = self.edge_types
        f = self.node_features(self.target)
        self.num_nodes, self.num_edges = self.node_counts[self.target], self.edge_counts[et]
        self.feat_dim, self.feat_dtype, self.row_bytes = f.feat_dim, f.feat_dtype, f.row_bytes
        self.topology = self.topologies[et]
        # array-like either way; on the SSD, DiskArrays whose slices and index arrays are engine reads
        self.indptr, self.indices = self.topology.indptr, self.topology.indices
        self.labels, self.features_path = self.target_labels, f.features_path
        self.feature_bytes = self.manifest.files["features"].nbytes

    def __getattr__(self, name: str):
        if name in _ONE_TYPE:  # only reached on a heterogeneous dataset, which never set them
            raise AttributeError(f"{name}: {self.root} is a heterogeneous dataset; ask per node type or relation "
                                 "(node_counts, feature_dims, node_features(t), topologies, target_labels)")
        raise AttributeError(f"'GraphDataset' object has no attribute {name!r}")

    def read_features(self, rows: slice | None = None) -> np.ndarray:
        """A homogeneous dataset's feature rows ``rows`` (default: all) read into memory through the engine."""
        start, stop, _ = (rows or slice(None)).indices(self.num_nodes)
        return _read_rows(self.node_features(self.target), start, max(start, stop), self.engine)

    # ------------------------------------------------------------ opening
    def _open_topologies(self) -> dict:
        cfg, m = self.config, self.manifest
        # one decision for every relation, on the compact bytes of all of them together
        indptr = "memory" if indptr_fits(cfg.indptr, cfg.topology_budget, [
            (self.node_counts[et[2]], self.edge_counts[et]) for et in self.edge_types]) else "ssd"
        out = {}
        for et in self.edge_types:
            ptr, idx = m.csc_keys(et)
            if cfg.topology == "ssd":
                out[et] = SsdTopology(self.paths[ptr], self.paths[idx], num_nodes=self.node_counts[et[2]],
                                      num_edges=self.edge_counts[et], index_dtype=m.edge_types[et].index_dtype,
                                      indptr=indptr, engine=self.engine)
            else:
                load = self._map if cfg.topology == "mmap" else self._load
                out[et] = ArrayTopology(load(ptr), load(idx))
        return out

    def _load(self, key: str) -> np.ndarray:
        return load_file(self.manifest.files[key], self.paths[key], self.engine)

    def _map(self, key: str) -> np.ndarray:
        return map_file(self.manifest.files[key], self.paths[key])

    def _check_invariants(self, labels: dict) -> None:
        # per relation, label array and split (terastack.gnn.storage.invariants)
        m, space = self.manifest, (lambda t: f"type {t!r}" if self.hetero else "the graph")  # in errors
        for et in self.edge_types:
            ptr, idx = m.csc_keys(et)
            check_csc(self.topologies[et], self.edge_counts[et], (self.paths[ptr], self.paths[idx]),
                      (self.node_counts[et[0]], space(et[0])))
        for t, lab in labels.items():
            check_labels(lab, self.num_classes, self.paths[m.labels_key(t)])
        for name, ids in self.splits.items():
            check_ids(ids, self.node_counts[self.target], self.paths[m.split_key(name)], f"{name} node id",
                      space(self.target))


def _read_rows(f: NodeFeatures, start: int, stop: int, engine) -> np.ndarray:
    from terastack import io

    out = io.aligned_empty((stop - start, f.feat_dim), f.feat_dtype)
    if stop > start:
        with io.open(f.features_path, "r", direct="auto", engine=engine) as file:
            file.read(out, start * f.row_bytes, (stop - start) * f.row_bytes, timeout=3600)
    return out


def open_dataset(root: str | os.PathLike, *, verify: str = "stamp", topology: str = "memory", indptr: str = "auto",
                 topology_budget: int = 0, engine=None) -> GraphDataset:
    """Open and verify the dataset in ``root``, either kind; see :class:`GraphDataset`."""
    return GraphDataset(GraphDataset.Config(root=os.fspath(root), verify=verify, topology=topology, indptr=indptr,
                                            topology_budget=topology_budget), engine=engine)

