"""A dataset's manifest, in either of its two formats, read as one typed description: node types, relations, a
target type, and the files that hold them.

A homogeneous dataset is a directory::

    manifest.json    format "terastack-gnn": counts, dtypes, and per file: path, dtype, shape, bytes, checksums
    indptr.bin       int64 [N+1]     CSC column pointers: the in-neighbours of node v are
    indices.bin      int32|int64 [E] indices[indptr[v]:indptr[v+1]] (messages flow indices -> v)
    features.bin     float32|float16 [N, F], row-major (row v at byte v * F * itemsize)
    labels.bin       int32 [N]
    train_idx.bin    int64 [n_train] (sorted node ids), and val_idx.bin, test_idx.bin

A heterogeneous one::

    manifest.json                             format "terastack-gnn-hetero": node types, relations, the target
    nodes/<type>/features.bin                 float32|float16 [N_type, F_type] (absent: no features)
    nodes/<type>/labels.bin                   int32 [N_type] (types with labels)
    nodes/<target>/{train,val,test}_idx.bin   int64, sorted ids of the target type
    edges/<src>___<rel>___<dst>/indptr.bin    int64 [N_dst + 1]   the in-neighbours (of type src) of node v of
    edges/<src>___<rel>___<dst>/indices.bin   int32|int64 [E]     type dst: indices[indptr[v]:indptr[v+1]]

Every file is raw little-endian bytes (nothing read is unpickled). Read by :func:`read_manifest`, both are the
same description (:class:`Manifest`'s ``node_types``, ``edge_types``, ``target`` and the file keys of each
part): a homogeneous dataset is the one-type, one-relation case, its type ``node`` and its relation
``node to node``. Names of types and relations are letters, digits, ``_`` and ``-`` (no ``___``): they
become paths.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from terastack.atomic import atomic_write_json
from terastack.gnn.storage.invariants import DatasetError

FORMAT, HETERO_FORMAT = "terastack-gnn", "terastack-gnn-hetero"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STAMP = ".verified.json"
CHECKSUM_CHUNK = 64 << 20
#: A manifest larger than this is not a manifest (it lists a handful of files).
_MANIFEST_MAX_BYTES = 16 << 20
FEATURE_DTYPES = ("float32", "float16")
INDEX_DTYPES = ("int32", "int64")
#: a homogeneous dataset's file key -> file name; the order is the order they are written and checked in
FILES = {"indptr": "indptr.bin", "indices": "indices.bin", "labels": "labels.bin",
         "train_idx": "train_idx.bin", "val_idx": "val_idx.bin", "test_idx": "test_idx.bin",
         "features": "features.bin"}
SPLIT_KEYS = ("train_idx", "val_idx", "test_idx")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")

EdgeType = tuple[str, str, str]
#: the node type and the relation a homogeneous dataset is the one-type, one-relation case of
NODE = "node"
HOMOGENEOUS_RELATION: EdgeType = (NODE, "to", NODE)


def check_name(name: str, what: str) -> str:
    """A node type or relation name usable in a path (see the module docstring)."""
    if not isinstance(name, str) or not _NAME.match(name) or "___" in name:
        raise DatasetError(f"{what} {name!r}: names must be letters, digits, '_' and '-' (no '___')")
    return name


def node_dir(node_type: str) -> str:
    return f"nodes/{node_type}"


def edge_dir(edge_type: EdgeType) -> str:
    """``edges/src___rel___dst``: the relation's directory (OGB's and MAG240M's spelling)."""
    return f"edges/{'___'.join(edge_type)}"


# ---------------------------------------------------------------- checksums
def file_checksums(path: str | os.PathLike, chunk_bytes: int = CHECKSUM_CHUNK, *, engine=None) -> list[str]:
    """SHA-256 of each ``chunk_bytes`` chunk of ``path``, read through the storage engine (O_DIRECT). The read of
    chunk i+1 is in flight while chunk i is hashed (hashlib releases the GIL): about min(disk, hash) speed,
    without polluting the page cache."""
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


# ---------------------------------------------------------------- the typed description
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


@dataclass(kw_only=True, slots=True)
class Manifest:
    """Either format's manifest as one typed description (see the module docstring); ``hetero`` says which."""

    hetero: bool
    target: str
    num_classes: int
    node_types: dict[str, NodeTypeInfo]
    edge_types: dict[EdgeType, EdgeTypeInfo]
    files: dict[str, FileEntry]
    #: how the dataset was made (generator parameters or import sources), for the record
    origin: dict

    # the file keys of each part
    def features_key(self, t: str) -> str:
        return f"{node_dir(t)}/features" if self.hetero else "features"

    def labels_key(self, t: str) -> str:
        return f"{node_dir(t)}/labels" if self.hetero else "labels"

    def split_key(self, name: str) -> str:
        return f"{node_dir(self.target)}/{name}_idx" if self.hetero else f"{name}_idx"

    def csc_keys(self, et: EdgeType) -> tuple[str, str]:
        return (f"{edge_dir(et)}/indptr", f"{edge_dir(et)}/indices") if self.hetero else ("indptr", "indices")

    def layout(self, sizes: dict | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
        """File key (its path without ``.bin``) -> (dtype, shape) every file must have; the splits' sizes are
        ``sizes`` (split key -> length), else the listed files'."""
        if sizes is None:
            sizes = {k: (self.files[key].shape or (-1,))[0] if (key := self.split_key(k[:-4])) in self.files else -1
                     for k in SPLIT_KEYS}
        out = {}  # in the order they are written and checked: topology, labels, splits, features (FILES')
        for et, info in self.edge_types.items():
            ptr, idx = self.csc_keys(et)
            out[ptr], out[idx] = ("int64", (self.node_types[et[2]].num_nodes + 1,)), (info.index_dtype, (info.num_edges,))
        out.update({self.labels_key(t): ("int32", (i.num_nodes,)) for t, i in self.node_types.items() if i.labelled})
        out.update({self.split_key(k[:-4]): ("int64", (sizes[k],)) for k in SPLIT_KEYS})
        out.update({self.features_key(t): (i.feat_dtype, (i.num_nodes, i.feat_dim))
                    for t, i in self.node_types.items() if i.feat_dim})
        return out

    def to_dict(self) -> dict:
        files = {k: e.to_dict() for k, e in self.files.items()}
        if self.hetero:
            return {"format": HETERO_FORMAT, "version": FORMAT_VERSION, "target": self.target,
                    "num_classes": self.num_classes, "node_types": {k: v.to_dict() for k, v in self.node_types.items()},
                    "edge_types": [{"src": s, "rel": r, "dst": d, **v.to_dict()}
                                   for (s, r, d), v in self.edge_types.items()],
                    "origin": self.origin, "files": files}
        node, (edges,) = self.node_types[NODE], self.edge_types.values()
        return {"format": FORMAT, "version": FORMAT_VERSION, "num_nodes": node.num_nodes,
                "num_edges": edges.num_edges, "feat_dim": node.feat_dim, "feat_dtype": node.feat_dtype,
                "num_classes": self.num_classes, "origin": self.origin, "files": files}


def _homogeneous(data: dict, where: str) -> Manifest:
    def need(key, kind):
        return need_field(data, key, kind, "", where)

    feat_dtype = need("feat_dtype", str)
    if feat_dtype not in FEATURE_DTYPES:
        raise DatasetError(f"{where}: field feat_dtype must be one of {FEATURE_DTYPES}, got {feat_dtype!r}")
    files_raw = need("files", dict)
    files = {key: parse_file_entry(need_field(files_raw, key, dict, "files.", where), key, where) for key in FILES}
    if files["indices"].dtype not in INDEX_DTYPES:
        raise DatasetError(f"{where}: field files.indices.dtype must be one of {INDEX_DTYPES}")
    origin = data.get("origin", {})
    return Manifest(hetero=False, target=NODE, num_classes=need("num_classes", int),
                    node_types={NODE: NodeTypeInfo(num_nodes=need("num_nodes", int), feat_dim=need("feat_dim", int),
                                                   feat_dtype=feat_dtype, labelled=True)},
                    edge_types={HOMOGENEOUS_RELATION: EdgeTypeInfo(num_edges=need("num_edges", int),
                                                                   index_dtype=files["indices"].dtype)},
                    files=files, origin=origin if isinstance(origin, dict) else {})


def _heterogeneous(data: dict, where: str) -> Manifest:
    def need(obj, key, kind, ctx=""):
        return need_field(obj, key, kind, ctx, where)

    node_types = {}
    for name, raw in sorted(need(data, "node_types", dict).items()):
        ctx = f"node_types.{check_name(name, 'node type')}."
        dim = need(raw, "feat_dim", int, ctx)
        dtype = raw.get("feat_dtype") if isinstance(raw, dict) else None
        if dim and dtype not in FEATURE_DTYPES:
            raise DatasetError(f"{where}: field {ctx}feat_dtype must be one of {FEATURE_DTYPES}, got {dtype!r}")
        node_types[name] = NodeTypeInfo(num_nodes=need(raw, "num_nodes", int, ctx), feat_dim=dim,
                                        feat_dtype=dtype if dim else None, labelled=bool(need(raw, "labelled", bool, ctx)))
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
    return Manifest(hetero=True, target=target, num_classes=need(data, "num_classes", int), node_types=node_types,
                    edge_types=edge_types, files=files, origin=origin if isinstance(origin, dict) else {})


def read_manifest(root: Path) -> Manifest:
    """The manifest of the dataset in ``root``, either format, checked field by field: where a dataset's graph kind
    is decided (by its format)."""
    where = str(root / MANIFEST)
    data = read_manifest_json(root)
    formats = {FORMAT: _homogeneous, HETERO_FORMAT: _heterogeneous}
    fmt = need_field(data, "format", str, "", where)
    if fmt not in formats:
        raise DatasetError(f"{where}: field format is {fmt!r}, expected {FORMAT!r} or {HETERO_FORMAT!r}")
    if need_field(data, "version", int, "", where) != FORMAT_VERSION:
        raise DatasetError(f"{where}: field version is {data['version']}, this terastack reads {FORMAT_VERSION}")
    return formats[fmt](data, where)


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
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: not a dataset manifest (a JSON object)")
    return data


# ---------------------------------------------------------------- writing
def _commit(root: str | os.PathLike, manifest: Manifest, engine) -> Manifest:
    """Hash every file of a finished build (``<key>.bin``, in either format) and commit the manifest atomically:
    the dataset's commit point."""
    root = Path(root)
    sizes = {k: os.path.getsize(root / f"{manifest.split_key(k[:-4])}.bin") // 8 for k in SPLIT_KEYS}
    manifest.files = {key: file_entry(root, key, f"{key}.bin", dtype, shape, engine=engine)
                      for key, (dtype, shape) in manifest.layout(sizes).items()}
    atomic_write_json(root / MANIFEST, manifest.to_dict())
    write_stamp(root, manifest.files)
    return manifest


def write_manifest(root: str | os.PathLike, *, num_nodes: int, num_edges: int, feat_dim: int, feat_dtype: str,
                   num_classes: int, index_dtype: str, origin: dict, engine=None) -> Manifest:
    """Commit a finished homogeneous build (see :func:`_commit`)."""
    return _commit(root, Manifest(
        hetero=False, target=NODE, num_classes=num_classes, files={}, origin=origin,
        node_types={NODE: NodeTypeInfo(num_nodes=num_nodes, feat_dim=feat_dim, feat_dtype=feat_dtype, labelled=True)},
        edge_types={HOMOGENEOUS_RELATION: EdgeTypeInfo(num_edges=num_edges, index_dtype=index_dtype)}), engine)


def write_hetero_manifest(root: str | os.PathLike, *, node_types: dict[str, NodeTypeInfo],
                          edge_types: dict[EdgeType, EdgeTypeInfo], target: str, num_classes: int, origin: dict,
                          engine=None) -> Manifest:
    """Commit a finished heterogeneous build (see :func:`_commit`)."""
    return _commit(root, Manifest(hetero=True, target=target, num_classes=num_classes, node_types=node_types,
                                  edge_types=edge_types, files={}, origin=origin), engine)


# ---------------------------------------------------------------- verification
def verify_checksums(root: Path, files: dict[str, FileEntry], paths: dict[str, Path], mode: str, *,
                     engine=None) -> str:
    """Check every file's chunk checksums per ``mode`` (terastack.gnn.storage.dataset [Note: verification]);
    returns what was checked."""
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


def _manifest_hash(root: Path) -> str:
    return hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()


def write_stamp(root: Path, files: dict[str, FileEntry]) -> None:
    """Record that ``files`` were fully checked as they are now (terastack.gnn.storage.dataset [Note: verification])."""
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
