"""The on-disk GNN dataset: CSC topology, row-major features, labels, splits, a manifest.

A dataset is a directory::

    manifest.json    format, counts, dtypes, and per file: path, dtype, shape, bytes, checksums
    indptr.bin       int64 [N+1]     CSC column pointers: the in-neighbours of node v are
    indices.bin      int32|int64 [E] indices[indptr[v]:indptr[v+1]] (messages flow indices -> v)
    features.bin     float32|float16 [N, F], row-major (row v at byte v * F * itemsize)
    labels.bin       int32 [N]
    train_idx.bin    int64 [n_train] (sorted node ids), and val_idx.bin, test_idx.bin

Every file is raw little-endian bytes, so nothing read is ever unpickled and the
feature file can be read by row extents with O_DIRECT.

[Note: verification]
Opening a dataset checks the manifest's fields, that every file exists with
exactly the size the manifest states (a truncated file is an error naming it),
and the structural invariants (indptr monotone from 0 to E, indices and split ids
in range, labels below the class count). Content checksums (SHA-256 per 64 MiB
chunk) are checked in full the first time; a successful full check writes a
stamp (``.verified.json``) keyed to each file's size, inode, mtime and ctime and
to the manifest's own hash, so later opens of an unchanged dataset skip the
re-hash. Any write to a file changes its ctime, which invalidates the stamp.
``verify="full"`` always re-hashes (use it after copying a dataset between
machines); ``verify="size"`` skips checksums and says so in ``verified``.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from terastack.atomic import atomic_write_json, safe_relative
from terastack.gnn.storage.invariants import DatasetError, check_csc, check_files, check_ids, check_labels, load_file, map_file
from terastack.gnn.storage.topology import INDPTR_MODES, ArrayTopology, SsdTopology

FORMAT = "terastack-gnn"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STAMP = ".verified.json"
CHECKSUM_CHUNK = 64 << 20
#: A manifest larger than this is not a manifest (it lists a handful of files).
_MANIFEST_MAX_BYTES = 16 << 20
FEATURE_DTYPES = ("float32", "float16")
INDEX_DTYPES = ("int32", "int64")
#: file key -> file name; the order is the order they are written and checked in.
FILES = {"indptr": "indptr.bin", "indices": "indices.bin", "labels": "labels.bin",
         "train_idx": "train_idx.bin", "val_idx": "val_idx.bin", "test_idx": "test_idx.bin",
         "features": "features.bin"}
VERIFY_MODES = ("stamp", "full", "size")
TOPOLOGY_MODES = ("memory", "mmap", "ssd")


def check_read_modes(*, verify: str, topology: str) -> None:
    """Raise ValueError naming the field unless ``verify`` and ``topology`` are known modes (every config that
    opens a dataset, homogeneous or heterogeneous, checks them the same way)."""
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify: must be one of {', '.join(VERIFY_MODES)}; got {verify!r}")
    if topology not in TOPOLOGY_MODES:
        raise ValueError(f"topology: must be one of {', '.join(TOPOLOGY_MODES)}; got {topology!r}")


# ---------------------------------------------------------------- checksums
def file_checksums(path: str | os.PathLike, chunk_bytes: int = CHECKSUM_CHUNK, *, engine=None) -> list[str]:
    """SHA-256 of each ``chunk_bytes`` chunk of ``path``, read through the storage engine (O_DIRECT).

    The read of chunk i+1 is in flight while chunk i is hashed (hashlib releases
    the GIL), so this runs at about min(disk, hash) speed without polluting the
    page cache.
    """
    from terastack import io

    size = os.path.getsize(path)
    if size == 0:
        return [hashlib.sha256(b"").hexdigest()]
    bufs = [io.aligned_empty(chunk_bytes), io.aligned_empty(chunk_bytes)]
    digests: list[str] = []
    with io.open(path, "r", direct="auto", engine=engine) as f:
        starts = list(range(0, size, chunk_bytes))
        pending = f.pread(bufs[0], 0, min(chunk_bytes, size))
        for i, start in enumerate(starts):
            n = pending.result(timeout=600)
            if i + 1 < len(starts):
                nxt = starts[i + 1]
                pending = f.pread(bufs[(i + 1) % 2], nxt, min(chunk_bytes, size - nxt))
            digests.append(hashlib.sha256(memoryview(bufs[i % 2])[:n]).hexdigest())
    return digests


def _file_identity(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


# ---------------------------------------------------------------- manifest
@dataclass(kw_only=True, slots=True)
class FileEntry:
    key: str
    path: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunk_bytes: int
    checksums: list[str]

    def to_dict(self) -> dict:
        return {"path": self.path, "dtype": self.dtype, "shape": list(self.shape), "bytes": self.nbytes,
                "checksum": {"algo": "sha256", "chunk_bytes": self.chunk_bytes, "chunks": self.checksums}}


@dataclass(kw_only=True, slots=True)
class Manifest:
    num_nodes: int
    num_edges: int
    feat_dim: int
    feat_dtype: str
    num_classes: int
    files: dict[str, FileEntry]
    #: how the dataset was made (generator parameters or import sources), for the record
    origin: dict

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": FORMAT_VERSION, "num_nodes": self.num_nodes,
                "num_edges": self.num_edges, "feat_dim": self.feat_dim, "feat_dtype": self.feat_dtype,
                "num_classes": self.num_classes, "origin": self.origin,
                "files": {k: e.to_dict() for k, e in self.files.items()}}

    @classmethod
    def from_dict(cls, data, where: str) -> "Manifest":
        def need(obj, key, kind, ctx):
            return need_field(obj, key, kind, ctx, where)

        if need(data, "format", str, "") != FORMAT:
            raise DatasetError(f"{where}: field format is {data['format']!r}, expected {FORMAT!r}")
        if need(data, "version", int, "") != FORMAT_VERSION:
            raise DatasetError(f"{where}: field version is {data['version']}, this terastack reads {FORMAT_VERSION}")
        feat_dtype = need(data, "feat_dtype", str, "")
        if feat_dtype not in FEATURE_DTYPES:
            raise DatasetError(f"{where}: field feat_dtype must be one of {FEATURE_DTYPES}, got {feat_dtype!r}")
        files_raw = need(data, "files", dict, "")
        files: dict[str, FileEntry] = {}
        for key in FILES:
            files[key] = parse_file_entry(need(files_raw, key, dict, "files."), key, where)
        origin = data.get("origin", {})
        return cls(num_nodes=need(data, "num_nodes", int, ""), num_edges=need(data, "num_edges", int, ""),
                   feat_dim=need(data, "feat_dim", int, ""), feat_dtype=feat_dtype,
                   num_classes=need(data, "num_classes", int, ""), files=files,
                   origin=origin if isinstance(origin, dict) else {})


def need_field(obj, key, kind, ctx: str, where: str):
    """``obj[key]`` of type ``kind`` (int: non-negative), else a DatasetError naming ``where`` and the field."""
    if not isinstance(obj, dict) or key not in obj:
        raise DatasetError(f"{where}: field {ctx}{key} is missing")
    value = obj[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise DatasetError(f"{where}: field {ctx}{key} must be a non-negative integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise DatasetError(f"{where}: field {ctx}{key} must be a {kind.__name__}, got {value!r}")
    return value


def parse_file_entry(entry: dict, key: str, where: str) -> FileEntry:
    """One ``files.<key>`` entry of a manifest, checked field by field (errors name ``where`` and the field)."""
    ctx = f"files.{key}."
    checksum = need_field(entry, "checksum", dict, ctx, where)
    if need_field(checksum, "algo", str, ctx + "checksum.", where) != "sha256":
        raise DatasetError(f"{where}: field {ctx}checksum.algo must be 'sha256'")
    chunks = need_field(checksum, "chunks", list, ctx + "checksum.", where)
    if not all(isinstance(c, str) for c in chunks):
        raise DatasetError(f"{where}: field {ctx}checksum.chunks must be a list of hex strings")
    shape = need_field(entry, "shape", list, ctx, where)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape):
        raise DatasetError(f"{where}: field {ctx}shape must be a list of non-negative integers")
    return FileEntry(key=key, path=need_field(entry, "path", str, ctx, where),
                     dtype=need_field(entry, "dtype", str, ctx, where),
                     shape=tuple(shape), nbytes=need_field(entry, "bytes", int, ctx, where),
                     chunk_bytes=need_field(checksum, "chunk_bytes", int, ctx + "checksum.", where), checksums=chunks)


def file_entry(root: Path, key: str, relpath: str, dtype: str, shape: tuple[int, ...], *, engine=None) -> FileEntry:
    """The manifest entry of a finished file: its size must be exactly ``shape`` x ``dtype``; hashed in chunks."""
    path = root / relpath
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    actual = path.stat().st_size
    if actual != nbytes:
        raise DatasetError(f"{path}: {actual} bytes written, {nbytes} expected for {dtype} {shape}")
    return FileEntry(key=key, path=relpath, dtype=dtype, shape=tuple(shape), nbytes=nbytes,
                     chunk_bytes=CHECKSUM_CHUNK, checksums=file_checksums(path, engine=engine))


def verify_checksums(root: Path, files: dict[str, FileEntry], paths: dict[str, Path], mode: str, *,
                     engine=None) -> str:
    """Check every file's chunk checksums per ``mode`` (see [Note: verification]); returns what was checked."""
    if mode == "size":
        return "sizes only (checksums not checked)"
    if mode == "stamp" and _stamp_matches(root, files):
        return "checksums (stamp of an earlier full check; files unchanged since)"
    for key, entry in files.items():
        actual = file_checksums(paths[key], entry.chunk_bytes, engine=engine)
        bad = [i for i, (a, b) in enumerate(zip(actual, entry.checksums)) if a != b]
        if bad:
            i = bad[0]
            lo, hi = i * entry.chunk_bytes, min((i + 1) * entry.chunk_bytes, entry.nbytes)
            raise DatasetError(f"{paths[key]}: checksum mismatch in bytes {lo}..{hi} "
                               f"({len(bad)} of {len(entry.checksums)} chunks differ; field files.{key}): "
                               "the file is corrupt or was changed after the manifest was written")
    write_stamp(root, files)
    return "checksums (full)"


def read_manifest_json(root: Path) -> dict:
    """The parsed ``manifest.json`` of ``root`` (errors name the file; an interrupted build is named as such)."""
    path = root / MANIFEST
    if not root.is_dir():
        raise DatasetError(f"{root}: dataset directory does not exist")
    if not path.is_file():
        partial = " (a build was interrupted here: rerun the same gen/import command to resume)" \
            if any(root.glob(".build-state*.json")) else ""
        raise DatasetError(f"{path}: manifest is missing, so {root} is not a finished dataset{partial}")
    if path.stat().st_size > _MANIFEST_MAX_BYTES:
        raise DatasetError(f"{path}: {path.stat().st_size} bytes is too large for a manifest")
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None


def expected_layout(num_nodes: int, num_edges: int, feat_dim: int, feat_dtype: str, index_dtype: str,
                    split_sizes: dict[str, int]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """key -> (dtype, shape) every file must have for these counts."""
    return {"indptr": ("int64", (num_nodes + 1,)), "indices": (index_dtype, (num_edges,)),
            "labels": ("int32", (num_nodes,)), "train_idx": ("int64", (split_sizes["train_idx"],)),
            "val_idx": ("int64", (split_sizes["val_idx"],)), "test_idx": ("int64", (split_sizes["test_idx"],)),
            "features": (feat_dtype, (num_nodes, feat_dim))}


def write_manifest(root: str | os.PathLike, *, num_nodes: int, num_edges: int, feat_dim: int, feat_dtype: str,
                   num_classes: int, index_dtype: str, origin: dict, engine=None) -> Manifest:
    """Hash every file of a finished build and commit the manifest atomically (the dataset's commit point)."""
    root = Path(root)
    sizes = {k: os.path.getsize(root / FILES[k]) // 8 for k in ("train_idx", "val_idx", "test_idx")}
    files = {key: file_entry(root, key, FILES[key], dtype, shape, engine=engine)
             for key, (dtype, shape) in expected_layout(num_nodes, num_edges, feat_dim, feat_dtype, index_dtype,
                                                        sizes).items()}
    manifest = Manifest(num_nodes=num_nodes, num_edges=num_edges, feat_dim=feat_dim, feat_dtype=feat_dtype,
                        num_classes=num_classes, files=files, origin=origin)
    atomic_write_json(root / MANIFEST, manifest.to_dict())
    write_stamp(root, files)
    return manifest


def _manifest_hash(root: Path) -> str:
    return hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()


def write_stamp(root: Path, files: dict[str, FileEntry]) -> None:
    """Record that ``files`` were fully checked as they are now (see [Note: verification])."""
    stamp = {"manifest_sha256": _manifest_hash(root),
             "files": {e.path: _file_identity(root / e.path) for e in files.values()}}
    try:
        atomic_write_json(root / STAMP, stamp)
    except OSError:
        pass  # a read-only dataset directory is simply re-hashed on every open


def _stamp_matches(root: Path, files: dict[str, FileEntry]) -> bool:
    try:
        stamp = json.loads((root / STAMP).read_text())
        if stamp.get("manifest_sha256") != _manifest_hash(root):
            return False
        return all(stamp["files"].get(e.path) == _file_identity(root / e.path) for e in files.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


# ------------------------------------------------------------------- dataset
class GraphDataset:
    """An opened, verified dataset directory. See the module docstring for the format.

    Topology is loaded into host memory (``topology="memory"``), memory-mapped
    (``"mmap"``) or left in its files and read through the storage engine
    (``"ssd"``; ``self.topology`` is then a :class:`terastack.gnn.storage.topology.SsdTopology`);
    labels and splits are loaded into memory; features stay on disk and are read by row
    extents (:class:`terastack.gnn.storage.cache.UnifiedCache`).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        root: str
        #: "stamp" (full hash unless an unchanged, already verified dataset), "full", or "size"
        verify: str = "stamp"
        #: "memory": read indptr/indices into RAM; "mmap": map them (pages come from disk on demand);
        #: "ssd": leave them in their files, read through the storage engine per hop (terastack.gnn.storage.topology)
        topology: str = "memory"
        #: with topology="ssd": indptr in RAM ("memory"), on the SSD ("ssd"), or "auto" (RAM when it costs at
        #: most a quarter of ``topology_budget``; a heterogeneous dataset weighs every relation's together)
        indptr: str = "auto"
        #: with topology="ssd": the memory the topology may hold (bytes), which "auto" weighs indptr against
        topology_budget: int = 0

        def __post_init__(self) -> None:
            if not self.root:
                raise ValueError("root: the dataset directory is required")
            check_read_modes(verify=self.verify, topology=self.topology)
            if self.indptr not in INDPTR_MODES:
                raise ValueError(f"indptr: must be one of {', '.join(INDPTR_MODES)}; got {self.indptr!r}")
            if self.topology_budget < 0:
                raise ValueError(f"topology_budget: must be >= 0, got {self.topology_budget}")

    def __init__(self, config: "GraphDataset.Config | str | os.PathLike", *, engine=None):
        if not isinstance(config, GraphDataset.Config):
            config = GraphDataset.Config(root=os.fspath(config))
        self.config = config
        self.root = Path(config.root)
        self.engine = engine
        self.manifest = self._read_manifest()
        m = self.manifest
        self.num_nodes, self.num_edges = m.num_nodes, m.num_edges
        self.feat_dim, self.num_classes = m.feat_dim, m.num_classes
        self.feat_dtype = np.dtype(m.feat_dtype)
        self.row_bytes = self.feat_dim * self.feat_dtype.itemsize
        self.paths = {key: safe_relative(self.root, e.path) for key, e in m.files.items()}
        self._check_layout()
        self.verified = self._verify_contents()
        if config.topology == "ssd":
            self.topology = SsdTopology(self.paths["indptr"], self.paths["indices"], num_nodes=self.num_nodes,
                                        num_edges=self.num_edges, index_dtype=m.files["indices"].dtype,
                                        indptr=config.indptr, budget=config.topology_budget, engine=engine)
        else:
            load = self._map if config.topology == "mmap" else self._load
            self.topology = ArrayTopology(load("indptr"), load("indices"))
        # array-like either way; on the SSD, DiskArrays whose slices and index arrays are engine reads
        self.indptr = self.topology.indptr
        self.indices = self.topology.indices
        self.labels = self._load("labels")
        self.splits = {name: self._load(f"{name}_idx") for name in ("train", "val", "test")}
        self._check_invariants()

    # ------------------------------------------------------------ properties
    @property
    def features_path(self) -> Path:
        return self.paths["features"]

    @property
    def feature_bytes(self) -> int:
        return self.manifest.files["features"].nbytes

    def __repr__(self) -> str:
        return (f"GraphDataset({str(self.root)!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"features={self.feat_dim}x{self.feat_dtype.name}, classes={self.num_classes})")

    def close(self) -> None:
        """Close the topology's files (``topology="ssd"``); arrays in memory are left to the collector."""
        self.topology.close()

    # ------------------------------------------------------------- features
    def read_features(self, rows: slice | None = None) -> np.ndarray:
        """Rows ``rows`` (default: all) of the feature matrix read into memory through the engine."""
        from terastack import io

        start, stop, _ = (rows or slice(None)).indices(self.num_nodes)
        count = max(0, stop - start)
        out = io.aligned_empty((count, self.feat_dim), self.feat_dtype)
        if count:
            with io.open(self.features_path, "r", direct="auto", engine=self.engine) as f:
                f.read(out, start * self.row_bytes, count * self.row_bytes, timeout=3600)
        return out

    # --------------------------------------------------------------- checks
    def _read_manifest(self) -> Manifest:
        return Manifest.from_dict(read_manifest_json(self.root), str(self.root / MANIFEST))

    def _check_layout(self) -> None:
        m = self.manifest
        index_dtype = m.files["indices"].dtype
        if index_dtype not in INDEX_DTYPES:
            raise DatasetError(f"{self.root / MANIFEST}: field files.indices.dtype must be one of {INDEX_DTYPES}")
        sizes = {k: m.files[k].shape[0] if m.files[k].shape else -1 for k in ("train_idx", "val_idx", "test_idx")}
        layout = expected_layout(m.num_nodes, m.num_edges, m.feat_dim, m.feat_dtype, index_dtype, sizes)
        check_files(self.root / MANIFEST, layout, m.files, self.paths,
                    f" for {m.num_nodes} nodes, {m.num_edges} edges, {m.feat_dim} features")

    def _verify_contents(self) -> str:
        return verify_checksums(self.root, self.manifest.files, self.paths, self.config.verify, engine=self.engine)

    def _load(self, key: str) -> np.ndarray:
        return load_file(self.manifest.files[key], self.paths[key], self.engine)

    def _map(self, key: str) -> np.ndarray:
        return map_file(self.manifest.files[key], self.paths[key])

    def _check_invariants(self) -> None:
        # the one-relation case of terastack.gnn.storage.hetero_dataset's checks (terastack.gnn.storage.invariants)
        n, p = self.num_nodes, self.paths
        check_csc(self.topology, self.num_edges, (p["indptr"], p["indices"]), (n, "the graph"))
        check_labels(self.labels, self.num_classes, p["labels"])
        for name, ids in self.splits.items():
            check_ids(ids, n, p[f"{name}_idx"], f"{name} node id", "the graph")


def open_dataset(root: str | os.PathLike, *, verify: str = "stamp", topology: str = "memory", indptr: str = "auto",
                 topology_budget: int = 0, engine=None) -> GraphDataset:
    """Open and verify the dataset in ``root``; see :class:`GraphDataset`."""
    return GraphDataset(GraphDataset.Config(root=os.fspath(root), verify=verify, topology=topology, indptr=indptr,
                                            topology_budget=topology_budget), engine=engine)
