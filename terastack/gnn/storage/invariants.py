"""What opening a dataset checks (terastack.gnn.storage.dataset), written once for both kinds.

A homogeneous dataset is the one-type, one-relation case: every check here takes one relation's CSC, one label
array or one id list with the file it came from and the id space it points into, and raises a
:class:`DatasetError` naming that file (see terastack.gnn.storage.dataset [Note: verification]).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from terastack.gnn.storage.topology import stream_chunks


class DatasetError(ValueError):
    """A dataset directory is missing, truncated, corrupt or inconsistent. Names the file and the field."""


def check_files(manifest_path: Path, layout: dict, files: dict, paths: dict, context: str = "") -> None:
    """Every file the ``layout`` (key -> (dtype, shape)) asks for is listed in ``files`` with that dtype, shape, byte
    count and number of checksum chunks, and exists with exactly that size; nothing else is listed. ``context``
    (e.g. the counts the shapes follow from) is added to a shape mismatch."""
    extra = sorted(set(files) - set(layout))
    if extra:
        raise DatasetError(f"{manifest_path}: field files.{extra[0]} is not part of this dataset's layout")
    for key, (dtype, shape) in layout.items():
        where = f"{manifest_path}: field files.{key}"
        if key not in files:
            raise DatasetError(f"{where} is missing")
        entry = files[key]
        if entry.dtype != dtype or tuple(entry.shape) != shape:
            raise DatasetError(f"{where}: is {entry.dtype} {list(entry.shape)}, expected {dtype} {list(shape)}"
                               f"{context}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if entry.nbytes != nbytes:
            raise DatasetError(f"{where}.bytes: is {entry.nbytes}, but {dtype} {list(shape)} is {nbytes} bytes")
        expected_chunks = max(1, -(-nbytes // entry.chunk_bytes)) if entry.chunk_bytes else -1
        if len(entry.checksums) != expected_chunks:
            raise DatasetError(f"{where}.checksum.chunks: {len(entry.checksums)} chunks listed, "
                               f"{expected_chunks} expected for {nbytes} bytes")
        path = paths[key]
        if not path.is_file():
            raise DatasetError(f"{path}: file is missing (field files.{key})")
        actual = path.stat().st_size
        if actual != nbytes:
            what = "truncated" if actual < nbytes else "longer than the manifest says"
            raise DatasetError(f"{path}: {actual} bytes, manifest says {nbytes} ({what}; field files.{key})")


def check_csc(topology, num_edges: int, paths: tuple[Path, Path], sources: tuple[int, str]) -> None:
    """One relation's CSC: indptr runs monotonically from 0 to ``num_edges``; every neighbour id is below
    ``sources[0]``, the node count of its id space (described by ``sources[1]`` in errors). ``paths``: the
    indptr and indices files. Streamed, so a topology mapped or on the SSD is never read whole."""
    ip = topology.indptr
    if int(ip[0]) != 0 or int(ip[-1]) != num_edges:
        raise DatasetError(f"{paths[0]}: indptr must run from 0 to num_edges={num_edges}, "
                           f"runs from {int(ip[0])} to {int(ip[-1])}")
    previous = None
    for first, part in stream_chunks(ip):
        part = np.asarray(part, dtype=np.int64)
        steps = np.diff(part if previous is None else np.concatenate([[previous], part]))
        if (steps < 0).any():
            v = int(np.argmax(steps < 0)) + first - (previous is not None)
            raise DatasetError(f"{paths[0]}: indptr decreases at node {v}")
        if len(part):
            previous = part[-1]
    check_ids(topology.indices, sources[0], paths[1], "neighbour id", sources[1])


def check_ids(ids, num_nodes: int, path: Path, what: str, space: str) -> None:
    """Every id of ``ids`` (an array, a memmap or a DiskArray) lies in ``0..num_nodes-1``; ``space`` names the id
    space in the error (``the graph``, ``type 'paper'``)."""
    for first, part in stream_chunks(ids):
        bad = (part < 0) | (part >= num_nodes)
        if bad.any():
            i = int(np.argmax(bad))
            raise DatasetError(f"{path}: {what} {int(part[i])} at position {first + i} is out of range "
                               f"({space} has {num_nodes} nodes)")


def check_labels(labels: np.ndarray, num_classes: int, path: Path) -> None:
    """Every label lies in ``0..num_classes-1``."""
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise DatasetError(f"{path}: labels must be in 0..{num_classes - 1}, "
                           f"found {int(labels.min())}..{int(labels.max())}")


def load_file(entry, path: Path, engine=None) -> np.ndarray:
    """The whole file of a manifest ``entry`` in memory, read through the storage engine (O_DIRECT)."""
    from terastack import io

    out = io.aligned_empty(entry.shape, entry.dtype)
    if entry.nbytes:
        with io.open(path, "r", direct="auto", engine=engine) as f:
            f.read(out, 0, entry.nbytes, timeout=3600)
    return out


def map_file(entry, path: Path) -> np.ndarray:
    """The file of a manifest ``entry`` memory-mapped read-only (pages come from disk on demand)."""
    if entry.nbytes == 0:
        return np.zeros(entry.shape, entry.dtype)
    return np.memmap(path, dtype=entry.dtype, mode="r", shape=entry.shape)
