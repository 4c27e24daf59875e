"""The store on disk: one data file per directory, extents in them, and the manifest.

[Note: store layout]
Directory ``i`` of the store holds one data file, ``data.bin`` for the first
and ``data.<i>.bin`` for the others (so a reordered directory list is caught
as a missing or mismatched file, never read as another directory's bytes).
The first directory also holds ``manifest.json``: per tensor its shape,
dtype, size, home tier and extent (offset, capacity and, for a store over
several directories, the directory index ``dir``).

A one-directory store writes exactly the manifest it always has (format
version 1, no ``dir`` fields). A store over several writes version 2, which
adds ``dirs``: per directory its data file's name and bytes in use. Version 1
is still read (as one directory); a version-1 reader refuses version 2 rather
than misreading extents of other directories from ``data.bin``. Reopening
with a different number of directories than the manifest describes is an
error naming both counts.

[Note: crash consistency]
``commit()`` fdatasyncs every data file, then writes the manifest atomically
(temp name, fdatasync, rename, fsync of the directory). Until the next
commit, a writeback never overwrites an extent named by the last manifest: it
goes to a fresh extent (copy on write) and the old one is freed at the next
commit. A crash at any point therefore leaves the last committed state intact.

A store whose commits were pinned ([Note: versions and commits] in
terastack.tiers.versions) adds a ``versions`` block to the manifest (either
format version): its identity, the last generation, and the extents of each
pinned commit, which a reopened store keeps allocated.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from terastack.atomic import atomic_write_json
from terastack.constants import DIRECT_ALIGN
from terastack.dtypes import dtype_name, to_dtype
from terastack.io import File, IOEngine
from terastack.tiers.extents import Extent, ExtentAllocator
from terastack.tiers.placement import PlacementPolicy
from terastack.tiers.record import State, TensorRecord, Tier, tensor_nbytes
from terastack.tiers.versions import Versions

MANIFEST = "manifest.json"
DATA_FILE = "data.bin"
FORMAT = "terastack.tiers"
FORMAT_VERSION = 1        # one directory: the manifest as it has always been
FORMAT_VERSION_DIRS = 2   # several directories: adds "dirs" and each entry's "dir"
#: A data file grows by at least this much at a time (fewer fallocate calls).
GROW_STEP = 64 << 20


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Deallocate a byte range of a file (it then reads back as zeros, the file keeps its size). False where
    the file system cannot (the caller then writes zeros)."""
    fallocate = getattr(_libc, "fallocate", None)
    if fallocate is None:
        return False
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0


def data_file_name(index: int) -> str:
    """The data file of the store's directory ``index`` (``data.bin`` for the first)."""
    return DATA_FILE if index == 0 else f"data.{index}.bin"


def manifest_versions(root: str | Path) -> dict | None:
    """The ``versions`` block of the manifest in store directory ``root`` (None for a store never pinned);
    FileNotFoundError when there is no manifest. For a reader outside the store: a checkpoint beside it."""
    path = Path(root) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"store manifest {path} is unreadable: {exc}") from None
    block = manifest.get("versions") if isinstance(manifest, dict) else None
    return block if isinstance(block, dict) else None


class StoreLayout:
    """The data files of a store's directories, the extents allocated in them, and its manifest.

    Thread-safe for allocation and freeing; ``load``/``save`` are called by the store under its lock."""

    def __init__(self, dirs: Sequence[str | Path], *, placement: PlacementPolicy, direct: bool | str,
                 engine: IOEngine):
        if not dirs:
            raise ValueError("dirs: a store needs at least one directory")
        self.dirs = tuple(Path(d) for d in dirs)
        self.placement = placement
        self._lock = threading.Lock()
        # read (and check against `dirs`) before any data file is created: a refused open leaves no trace
        self._manifest = self._read_manifest()
        self.files: list[File] = []
        try:
            for i, d in enumerate(self.dirs):
                d.mkdir(parents=True, exist_ok=True)
                path = d / data_file_name(i)
                self.files.append(File(path, "r+" if path.exists() else "x", direct=direct, engine=engine))
        except BaseException:
            self.close()
            raise
        self._sizes = [f.size for f in self.files]
        # below this offset a data file may hold bytes of earlier extents (freed since, or written and never
        # committed before a crash); above it, only never-written fallocated space, which reads back as zeros
        self._stale_end = list(self._sizes)
        self._extents = [ExtentAllocator(dir=i) for i in range(len(self.dirs))]
        self._live = [0] * len(self.dirs)  # bytes of allocated extents per directory (what placement sees)

    @property
    def root(self) -> Path:
        """The first directory: it holds the manifest."""
        return self.dirs[0]

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    # ------------------------------------------------------------ extents
    def file(self, extent: Extent) -> File:
        """The data file ``extent`` lives in."""
        return self.files[extent.dir]

    def alloc(self, padded: int, *, zero: bool = False) -> Extent:
        """A fresh extent of ``padded`` bytes in the directory the placement policy picks; its file grows to
        cover it (by at least GROW_STEP, or exactly when ``zero``: fallocated bytes read back as zeros)."""
        with self._lock:
            d = self.placement.place(padded, tuple(self._live))
            if not isinstance(d, int) or not 0 <= d < len(self.dirs):
                raise ValueError(f"placement policy {self.placement!r} chose directory {d!r} of "
                                 f"{len(self.dirs)}")
            ext = self._extents[d].alloc(padded)
            self._live[d] += ext.capacity
            end = ext.offset + ext.capacity
            if end > self._sizes[d]:
                new_size = max(end, self._sizes[d] + GROW_STEP) if not zero else end
                self.files[d].allocate(new_size)
                self._sizes[d] = new_size
            if zero and ext.offset < self._stale_end[d]:
                self._write_zeros(ext, min(end, self._stale_end[d]))
            self._stale_end[d] = max(self._stale_end[d], end)
            return ext

    def _write_zeros(self, ext: Extent, until: int) -> None:
        """Zero ``ext`` up to ``until``: space that held an earlier extent's bytes must not show through a
        tensor created as zeros. Only reused space pays for this; fresh extents are fallocated zeros.

        Synchronous system calls, no engine future: the caller holds the store's lock, and an engine
        completion waiting for that lock would never let a future of ours complete."""
        fd, offset, length = self.files[ext.dir].fileno(), ext.offset, until - ext.offset
        if punch_hole(fd, offset, length):
            return
        zeros = bytes(min(length, 4 << 20))
        for start in range(offset, until, len(zeros)):
            os.pwrite(fd, zeros[: min(len(zeros), until - start)], start)

    def free(self, extent: Extent) -> None:
        with self._lock:
            self._extents[extent.dir].free(extent)
            self._live[extent.dir] -= extent.capacity

    def usage(self) -> dict:
        """Bytes in use (up to the last extent ever handed out) and live (in allocated extents), per directory
        and in total."""
        with self._lock:
            per_dir = [{"dir": str(d), "used": a.end, "live": live}
                       for d, a, live in zip(self.dirs, self._extents, self._live)]
        return {"used": sum(p["used"] for p in per_dir), "live": sum(p["live"] for p in per_dir),
                "dirs": per_dir}

    # ------------------------------------------------------------ durability
    def sync(self) -> None:
        for f in self.files:
            f.sync()

    def close(self) -> None:
        for f in self.files:
            if not f.closed:
                f.close()

    def save(self, records: Mapping[str, TensorRecord], head: Mapping[str, Extent],
             versions: dict | None = None) -> Path:
        """Write the manifest naming ``head``'s extent of each record (and the ``versions`` block), atomically.
        See [Note: store layout]."""
        multi = len(self.dirs) > 1
        entries = {}
        for name, ext in head.items():
            rec = records[name]
            if ext is None or (ext == rec.extent and not rec.on_disk):
                raise RuntimeError(f"tensor {name!r} has no SSD copy at commit")
            entries[name] = {"shape": list(rec.shape), "dtype": dtype_name(rec.dtype), "nbytes": rec.nbytes,
                             "home": rec.home.value, "offset": ext.offset, "capacity": ext.capacity}
            if multi:
                entries[name]["dir"] = ext.dir
        manifest = {"format": FORMAT, "version": FORMAT_VERSION_DIRS if multi else FORMAT_VERSION,
                    "data_file": DATA_FILE, "data_bytes": self._extents[0].end, "tensors": entries}
        if multi:
            manifest["dirs"] = [{"data_file": data_file_name(i), "data_bytes": a.end}
                                for i, a in enumerate(self._extents)]
        if versions is not None:
            manifest["versions"] = versions
        return atomic_write_json(self.manifest_path, manifest)

    def load(self) -> tuple[dict[str, TensorRecord], Versions]:
        """The records of the manifest, resting ON_SSD ({} for a new store), and its versions. Checks each
        entry's sizes and that every extent (also of a pinned commit) lies inside its data file."""
        if self._manifest is None:
            return {}, Versions()
        path = self.manifest_path
        tensors, data_bytes, block = self._manifest
        records: dict[str, TensorRecord] = {}
        for name, entry in tensors.items():
            records[name] = self._entry_record(path, name, entry)
        try:
            versions = Versions.from_manifest(block, {name: rec.extent for name, rec in records.items()})
        except ValueError as exc:
            raise ValueError(f"store manifest {path}: {exc}") from None
        used: list[set[Extent]] = [set() for _ in self.dirs]
        kept = [(name, rec.extent) for name, rec in records.items()]
        kept += [(f"{name} (pinned commit {g})", e) for g, m in versions.pinned.items() for name, e in m.items()]
        for name, ext in kept:
            if not 0 <= ext.dir < len(self.dirs) or ext.offset % DIRECT_ALIGN:
                raise ValueError(f"store manifest {path}: extent of {name!r} is malformed")
            if ext.offset + ext.capacity > self._sizes[ext.dir]:
                raise ValueError(f"store data file {self.files[ext.dir].path} is truncated: tensor {name!r} needs "
                                 f"bytes up to {ext.offset + ext.capacity}, file has {self._sizes[ext.dir]}")
            used[ext.dir].add(ext)
        with self._lock:
            for i, (alloc, exts) in enumerate(zip(self._extents, used)):
                alloc.end = max(data_bytes[i], max((e.offset + e.capacity for e in exts), default=0))
                alloc.rebuild_free_list(exts)
                self._live[i] = sum(e.capacity for e in exts)
        return records, versions

    def _read_manifest(self) -> tuple[dict, list[int], dict | None] | None:
        """The manifest's tensor entries, bytes in use per directory and versions block (None for a new store);
        raises if it is unreadable or describes another number of directories than this store has."""
        path = self.manifest_path
        if not path.exists():
            for d in self.dirs[1:]:
                if (d / MANIFEST).exists():  # a reordered list would open an empty store beside the real one
                    raise ValueError(f"directory {d} holds a store manifest but is not the first of "
                                     f"{', '.join(map(str, self.dirs))}: the directory with the manifest "
                                     f"comes first")
            return None
        try:
            manifest = json.loads(path.read_text())
            if manifest.get("format") != FORMAT:
                raise ValueError("not a terastack store manifest")
            if manifest.get("version") not in (FORMAT_VERSION, FORMAT_VERSION_DIRS):
                raise ValueError(f"store format version {manifest.get('version')} (this terastack reads "
                                 f"{FORMAT_VERSION} and {FORMAT_VERSION_DIRS})")
            if manifest.get("data_file") != DATA_FILE:
                raise ValueError(f"unexpected data file {manifest.get('data_file')!r}")
            dirs = manifest.get("dirs") or [{"data_file": DATA_FILE, "data_bytes": manifest.get("data_bytes", 0)}]
            for i, d in enumerate(dirs):
                if d.get("data_file") != data_file_name(i):
                    raise ValueError(f"unexpected data file {d.get('data_file')!r} for directory {i}")
            data_bytes = [int(d.get("data_bytes", 0)) for d in dirs]
            tensors = manifest["tensors"]
            if not isinstance(tensors, dict):
                raise TypeError("tensors is not a mapping")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"store manifest {path} is unreadable: {exc}") from None
        if len(dirs) != len(self.dirs):
            raise ValueError(f"store manifest {path} describes {len(dirs)} "
                             f"director{'y' if len(dirs) == 1 else 'ies'}, but the store was opened with "
                             f"{len(self.dirs)}: {', '.join(map(str, self.dirs))}")
        return tensors, data_bytes, manifest.get("versions")

    def _entry_record(self, path: Path, name: str, entry: dict) -> TensorRecord:
        """The record of one manifest entry, its sizes checked."""
        try:
            shape = tuple(int(s) for s in entry["shape"])
            dtype = to_dtype(entry["dtype"])
            d = int(entry.get("dir", 0))
            if not 0 <= d < len(self.dirs):
                raise ValueError(f"directory {d} of {len(self.dirs)}")
            ext = Extent(int(entry["offset"]), int(entry["capacity"]), d)
            home = Tier(entry["home"])
            nbytes = int(entry["nbytes"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"store manifest {path}: entry {name!r} is malformed ({exc})") from None
        rec = TensorRecord(name=name, shape=shape, dtype=dtype, nbytes=nbytes, home=home,
                           state=State.ON_SSD, tier=Tier.SSD, extent=ext, on_disk=True)
        if nbytes != tensor_nbytes(shape, dtype) or ext.offset % DIRECT_ALIGN or ext.capacity < rec.padded:
            raise ValueError(f"store manifest {path}: entry {name!r} has inconsistent sizes")
        return rec
