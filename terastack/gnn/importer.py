"""``terastack gnn import``: a dataset from numpy / OGB-style arrays already on disk.

Sources are ``.npy`` files, read memory-mapped (``allow_pickle=False``: an
object array is refused, never unpickled) in chunks, so the import runs in
bounded memory and resumes if interrupted (see [Note: resumable builds]), through the
one source importer (terastack.gnn.formats.source).

An OGB-style directory (``--ogb-dir``) holds ``edge_index.npy`` (2 x E, source
row then destination row, as ``ogb``'s ``graph["edge_index"]``),
``node_feat.npy`` (N x F), ``node_label.npy`` (N or N x 1) and the split as
``split/{train,valid,test}.npy`` or ``{train,valid,test}_idx.npy``. Single files
can be given instead (``--edge-index`` or ``--indptr``/``--indices``,
``--features``, ``--labels``, ``--train-idx``...). Every array is checked (shape,
dtype, ids in range) with errors naming the file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from terastack.gnn.formats.source import BuildOptions
from terastack.gnn.storage.manifest import DatasetError


def load_npy(path: str | os.PathLike, what: str) -> np.ndarray:
    """A memory-mapped ``.npy`` (never unpickled). Raises DatasetError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: {what} file does not exist")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:
        # numpy calls a file cut short "pickled data" (too short for the magic) or an mmap error: say which
        raise DatasetError(npy_truncation(path, what) or f"{path}: cannot read {what} as a numpy array without "
                           f"unpickling ({exc})") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read {what} ({exc})") from None
    if not isinstance(arr, np.ndarray):
        raise DatasetError(f"{path}: {what} must be a single .npy array")
    return arr


def npy_truncation(path: Path, what: str) -> str | None:
    """The message for an ``.npy`` file shorter than its header says it is (expected and actual bytes), or None
    if it is not one."""
    from numpy.lib import format as npformat

    size = path.stat().st_size
    magic = b"\x93NUMPY"
    with open(path, "rb") as f:
        head = f.read(len(magic))
        if len(head) < len(magic) and magic.startswith(head):   # cut inside the magic string (or empty)
            return f"{path}: {what} is truncated: {size} bytes, too short for a .npy header"
        f.seek(0)
        try:
            version = npformat.read_magic(f)
            read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            shape, _, dtype = read(f)
        except ValueError as exc:
            if "EOF" in str(exc):   # numpy's words for a header cut short
                return f"{path}: {what} is truncated: {size} bytes, inside its .npy header"
            return None
        expected = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < expected:
        return (f"{path}: {what} is truncated: its header says {shape} {dtype} ({expected} bytes with the header), "
                f"the file has {size} bytes")
    return None


def _need_int(arr: np.ndarray, path, what: str) -> None:
    if not np.issubdtype(arr.dtype, np.integer):
        raise DatasetError(f"{path}: {what} must hold integers, holds {arr.dtype}")


class GraphImporter:
    """``.npy`` arrays as a :class:`~terastack.gnn.formats.source.GraphSource`, written by the one source importer
    (terastack.gnn.formats.source.SourceImporter: resumable, bounded memory)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BuildOptions):
        out: str
        ogb_dir: str | None = None
        edge_index: str | None = None
        indptr: str | None = None
        indices: str | None = None
        features: str | None = None
        labels: str | None = None
        train_idx: str | None = None
        val_idx: str | None = None
        test_idx: str | None = None
        #: add every edge's reverse (OGB graphs such as arxiv are directed)
        undirected: bool = False

        def __post_init__(self) -> None:
            if not self.out:
                raise ValueError("out: an output directory is required")
            if self.ogb_dir:
                root = Path(self.ogb_dir)
                if not root.is_dir():
                    raise ValueError(f"ogb_dir: {root} is not a directory")

                def pick(*names):
                    return next((str(root / n) for n in names if (root / n).is_file()), None)
                self.edge_index = self.edge_index or pick("edge_index.npy")
                self.features = self.features or pick("node_feat.npy")
                self.labels = self.labels or pick("node_label.npy")
                self.train_idx = self.train_idx or pick("split/train.npy", "train_idx.npy")
                self.val_idx = self.val_idx or pick("split/valid.npy", "valid_idx.npy", "val_idx.npy")
                self.test_idx = self.test_idx or pick("split/test.npy", "test_idx.npy")
            if bool(self.edge_index) == bool(self.indptr or self.indices):
                raise ValueError("edge_index, indptr/indices: give the edges either as edge_index (2 x E) or as "
                                 "CSC indptr + indices, exactly one of the two")
            if (self.indptr is None) != (self.indices is None):
                raise ValueError("indptr, indices: CSC input needs both files")
            for name in ("features", "labels", "train_idx"):
                if not getattr(self, name):
                    raise ValueError(f"{name}: a .npy file is required (or --ogb-dir holding it)")
            BuildOptions.check(self)

    def __init__(self, config: "GraphImporter.Config", *, engine=None):
        self.config = config
        self.engine = engine

    def run(self) -> dict:
        from terastack.gnn.formats.source import SourceImporter

        cfg = self.config
        options = SourceImporter.Config(out=cfg.out, undirected=cfg.undirected, dtype=cfg.dtype, classes=cfg.classes,
                                        memory_budget=cfg.memory_budget, force=cfg.force, progress=cfg.progress)
        return SourceImporter(self.source(), options, engine=self.engine).run()

    def source(self):
        """The arrays as a GraphSource, each checked (shape, dtype) with errors naming its file."""
        from terastack.gnn.formats.source import GraphSource, labels_from_values

        cfg = self.config
        feats = load_npy(cfg.features, "features")
        if feats.ndim != 2:
            raise DatasetError(f"{cfg.features}: features must be 2-D (nodes x features), shape is {feats.shape}")
        if not np.issubdtype(feats.dtype, np.floating) and not np.issubdtype(feats.dtype, np.integer):
            raise DatasetError(f"{cfg.features}: features must be numeric, dtype is {feats.dtype}")
        labels = load_npy(cfg.labels, "labels")
        edge_blocks, total, where = self._edges(feats.shape[0])
        splits = {key: path for key, path in (("train_idx", cfg.train_idx), ("val_idx", cfg.val_idx),
                                              ("test_idx", cfg.test_idx)) if path}
        return GraphSource(
            layout="npy", num_nodes=feats.shape[0], feat_dim=feats.shape[1], feat_dtype=feats.dtype,
            edge_blocks=edge_blocks, count_edges=lambda: total, edges_where=str(where),
            feature_blocks=lambda first, rows: (np.asarray(feats[a:a + rows]) for a in range(first, len(feats), rows)),
            features_where=str(cfg.features), labels=lambda: labels_from_values(np.asarray(labels), cfg.labels),
            labels_where=str(cfg.labels), files=self._sources(),
            splits=lambda _labels: {key: (load_npy(path, key), path) for key, path in splits.items()})

    def _sources(self) -> dict:
        cfg = self.config
        out = {}
        for key in ("edge_index", "indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx"):
            value = getattr(cfg, key)
            if value:
                st = Path(value).stat() if Path(value).exists() else None
                out[key] = {"path": os.path.abspath(value), "bytes": st.st_size if st else None,
                            "mtime_ns": st.st_mtime_ns if st else None}
        return out

    def _edges(self, n: int):
        """(edge_blocks, edge count, the file named in errors) of edge_index (2 x E) or CSC indptr + indices."""
        cfg = self.config
        if cfg.edge_index:
            ei = load_npy(cfg.edge_index, "edge_index")
            if ei.ndim != 2 or ei.shape[0] != 2:
                raise DatasetError(f"{cfg.edge_index}: edge_index must be 2 x E (sources, destinations), "
                                   f"shape is {ei.shape}")
            _need_int(ei, cfg.edge_index, "edge_index")

            def blocks(first: int, step: int):
                for s in range(first, ei.shape[1], step):
                    yield np.asarray(ei[0, s:s + step], np.int64), np.asarray(ei[1, s:s + step], np.int64)
            return blocks, ei.shape[1], cfg.edge_index
        indptr, indices = load_npy(cfg.indptr, "indptr"), load_npy(cfg.indices, "indices")
        _need_int(indptr, cfg.indptr, "indptr")
        _need_int(indices, cfg.indices, "indices")
        if indptr.shape != (n + 1,):
            raise DatasetError(f"{cfg.indptr}: indptr must have num_nodes + 1 = {n + 1} entries, has {indptr.shape}")
        ip = np.asarray(indptr, dtype=np.int64)
        if ip[0] != 0 or ip[-1] != len(indices) or (np.diff(ip) < 0).any():
            raise DatasetError(f"{cfg.indptr}: indptr must rise from 0 to len(indices) = {len(indices)}")

        def csc_blocks(first: int, step: int):
            for s in range(first, len(indices), step):
                e = min(len(indices), s + step)
                yield np.asarray(indices[s:e], np.int64), np.searchsorted(ip, np.arange(s, e), side="right") - 1
        return csc_blocks, len(indices), cfg.indices


def import_arrays(out: str | os.PathLike, **kwargs) -> dict:
    """Import a dataset into ``out``; keyword arguments are :class:`GraphImporter.Config` fields."""
    return GraphImporter(GraphImporter.Config(out=os.fspath(out), **kwargs)).run()
