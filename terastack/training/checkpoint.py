"""The checkpoint manager: snapshots of named ``Stateful`` components, written atomically, read back verified.

    save_checkpoint("ckpt", {"model": engine_state, "optimizer": optimizer, "rng": RNGState()}, step=10)
    snapshot = open_checkpoint("ckpt")          # its LATEST snapshot, sizes checked
    snapshot.load({"model": engine_state, "optimizer": optimizer, "rng": RNGState()})

A component is anything with ``state_dict()`` / ``load_state_dict(state)`` (:class:`Stateful`). The manager
composes a mapping of them and reaches into none: what a component saves is what its ``state_dict()`` returns.

[Note: checkpoint layout and atomicity]
A checkpoint directory holds one complete snapshot per ``step-NNNNNNNN`` subdirectory and a ``LATEST``
pointer::

    ckpt/LATEST                         {"checkpoint": "step-00000010", "step": 10}
    ckpt/step-00000010/state.bin        raw tensors, each 4 KiB-aligned
    ckpt/step-00000010/checkpoint.json  manifest: every component's JSON state; per tensor: dtype, shape,
                                        offset, bytes, CRC-32

A snapshot is written into a temporary directory, fsynced, renamed into place, and only then is ``LATEST``
replaced (write to a temp name, fdatasync, rename, fsync the directory). A crash at any point leaves ``LATEST``
naming the previous complete snapshot; older snapshots are removed after the pointer moves (one writer per
checkpoint directory).

[Note: what a component's state holds]
A state dict maps names to JSON values (numbers, strings, lists, dicts) or to tensors. A tensor is a
``torch.Tensor`` or a :class:`StreamedTensor` -- a shape and a function producing its pieces in order, called
only while the manager writes it, so a component whose tensors rest on an SSD streams them one piece at a time
and saving never needs more memory than training does. Tensors sit at the top level of the state dict. On load
each tensor comes back as a :class:`StoredTensor` handle: its shape and dtype, and ``read()``, which reads it
and checks its size and checksum (a mismatch is an error naming the file and the tensor). A component reads
its tensors one at a time, so loading needs no more memory than saving.

[Note: a checkpoint that does not fit]
Before anything is written the manager adds up the bytes the snapshot needs (every tensor, 4 KiB-aligned, and
room for the manifest) and compares them with the free bytes of the checkpoint's file system (the bytes an
unprivileged writer may use: [Note: room to write] in terastack.disk_room); a snapshot that cannot fit is refused in one line naming the
directory, the bytes needed and the bytes free. The previous snapshot stays until the new one is complete, so
the need is the new snapshot's whole size. A write that still fails for lack of space (another writer filled
the disk meanwhile) says the same, and leaves nothing of the attempt behind: the temporary directory goes, and
``LATEST`` still names the previous complete snapshot.

[Note: a checkpoint beside the store]
A component whose tensors already rest, durably, in files that will not change -- a store's pinned commit
([Note: versions and commits] in terastack.tiers.versions) -- returns them as :class:`ReferencedTensor`: the
manager writes where their bytes are (file, offset, bytes per piece), not the bytes, so the snapshot costs no
copy of them. Such a snapshot is complete only with those files: opening it checks that each exists and is long
enough (a missing or short file is an error naming it), and the component that saved the references checks
that the files still hold what it referenced (the store's identity and pinned generation) before it reads them.
After the pointer moves, a component with a ``checkpoint_saved(snapshot_dir)`` method is told, so that it can
let go of what only the previous snapshot referenced.

Nothing is unpickled: the manifest is JSON and tensors are raw bytes whose sizes and checksums are checked
before use; paths in a manifest are relative and may not leave the checkpoint directory, except a referenced
tensor's, which names the store file it is read from (and is only read). A format another
version of terastack wrote is read through an upgrade function its engine supplies (``upgrades``), which turns
its manifest into this one.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from terastack.atomic import atomic_write_json, fsync_dir, replace_dir, safe_relative
from terastack.constants import DIRECT_ALIGN, round_up
from terastack.disk_room import free_bytes
from terastack.dtypes import DTYPES, dtype_name

FORMAT = "terastack.checkpoint"
VERSION = 2
LATEST = "LATEST"
MANIFEST = "checkpoint.json"
DATA = "state.bin"


@runtime_checkable
class Stateful(Protocol):
    """A component that saves itself: what it returns from ``state_dict()`` (see [Note: what a component's
    state holds]) comes back to ``load_state_dict()`` when a checkpoint is resumed."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class StreamedTensor:
    """A tensor written piece by piece: ``pieces()`` yields its parts in order (any shapes, one dtype), their
    elements together ``shape``'s. ``dtype``: theirs, when known before they are produced (the space a snapshot
    needs is counted from it; None counts 4 bytes an element, the fp32 of training state)."""

    shape: tuple[int, ...]
    pieces: Callable[[], Iterable[torch.Tensor]]
    dtype: torch.dtype | None = None


@dataclass(frozen=True, slots=True)
class ReferencedTensor:
    """A tensor whose bytes lie in files the snapshot refers to instead of copying ([Note: a checkpoint beside the
    store]): ``pieces`` are (absolute file path, offset, bytes), in order, their bytes together ``shape``'s in
    ``dtype``."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    pieces: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """A tensor of a snapshot, read on demand (``read()``: checked against its size and CRC-32)."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int
    crc32: int
    snapshot: "Snapshot"
    #: a referenced tensor's pieces (file, offset, bytes): read from there, checked by the component that wrote
    #: the reference ([Note: a checkpoint beside the store])
    pieces: tuple[tuple[str, int, int], ...] = ()

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def read(self) -> torch.Tensor:
        n = self.numel
        flat = torch.empty(n, dtype=self.dtype)
        if self.pieces:
            return _read_pieces(flat.view(torch.uint8), self.pieces).view(self.dtype).view(self.shape)
        if n:
            self.snapshot.read_into(flat.view(torch.uint8), self.offset)
        crc = zlib.crc32(tensor_bytes(flat))
        if crc != self.crc32:
            raise ValueError(f"checkpoint data file {self.snapshot.data_path}: {self.key} fails its checksum "
                             f"(CRC-32 {crc:#010x}, manifest {self.crc32:#010x}); the file is corrupt")
        return flat.view(self.shape)


def _read_pieces(raw: torch.Tensor, pieces) -> torch.Tensor:
    from terastack.io import File

    at = 0
    for path, offset, nbytes in pieces:
        with File(path, "r", direct=False) as f:
            f.read(raw[at:at + nbytes], offset, nbytes)
        at += nbytes
    return raw


class JSONState:
    """A JSON mapping saved and loaded as it is (``value``): what a caller keeps beside the components."""

    def __init__(self, value: Mapping | None = None):
        self.value = dict(value or {})

    def state_dict(self) -> dict:
        return dict(self.value)

    def load_state_dict(self, state: dict) -> None:
        self.value = dict(state)


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of ``t`` (contiguous, on the host) as a uint8 array."""
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy()


# ------------------------------------------------------------------- save
#: room counted for a snapshot's manifest and pointer beside its tensors (see [Note: a checkpoint that does not fit])
MANIFEST_ROOM = 1 << 20


def _tensor_nbytes(value) -> int:
    n = int(np.prod(value.shape, dtype=np.int64))
    if isinstance(value, torch.Tensor):
        return n * value.element_size()
    return n * (torch.empty((), dtype=value.dtype).element_size() if value.dtype is not None else 4)


def snapshot_bytes(states: Mapping[str, Mapping[str, Any]]) -> int:
    """The bytes a snapshot of these component states takes on disk (see [Note: a checkpoint that does not
    fit])."""
    need = 0
    for state in states.values():
        for value in state.values():
            if isinstance(value, (torch.Tensor, StreamedTensor)):
                need = round_up(need, DIRECT_ALIGN) + _tensor_nbytes(value)
    return round_up(need, DIRECT_ALIGN) + MANIFEST_ROOM


class CheckpointSpaceError(OSError):
    """A snapshot does not fit on its file system: ``path``, ``needed`` and ``free`` (bytes) name the shortfall."""

    def __init__(self, path: Path, needed: int, free: int, *, during_write: bool = False):
        from terastack.units import format_bytes

        what = "ran out of space while writing" if during_write else "does not fit"
        super().__init__(errno.ENOSPC, f"checkpoint {path}: the snapshot {what}: it needs {format_bytes(needed)} "
                                       f"({needed} bytes), the file system has {format_bytes(free)} ({free} bytes) "
                                       "free; the previous checkpoint is kept")
        self.path, self.needed, self.free = path, needed, free


def save_checkpoint(path: str | os.PathLike, components: Mapping[str, Stateful], *, step: int) -> Path:
    """Write a snapshot of ``components`` as ``step-{step:08d}`` into checkpoint directory ``path`` (see [Note:
    checkpoint layout and atomicity]); returns the snapshot's directory. A snapshot that does not fit is
    refused before anything is written (:class:`CheckpointSpaceError`; [Note: a checkpoint that does not fit])."""
    root = Path(path)
    for cname in components:
        if "/" in cname:
            raise ValueError(f"component name {cname!r}: may not contain '/'")
    states = {cname: component.state_dict() for cname, component in components.items()}
    need = snapshot_bytes(states)
    made_root = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    free = free_bytes(root)
    if need > free:
        if made_root:
            shutil.rmtree(root, ignore_errors=True)
        raise CheckpointSpaceError(root, need, free)
    name = f"step-{step:08d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    placed = False
    try:
        tmp.mkdir()
        json_states, entries = {}, {}
        offset = 0
        with open(tmp / DATA, "wb") as f:
            for cname, state in states.items():
                json_states[cname] = {}
                for key, value in state.items():
                    if isinstance(value, ReferencedTensor):
                        entries[f"{cname}/{key}"] = _reference(value, f"{cname}/{key}")
                    elif isinstance(value, (torch.Tensor, StreamedTensor)):
                        offset = round_up(offset, DIRECT_ALIGN)
                        entries[f"{cname}/{key}"] = _write_tensor(f, offset, value, f"{cname}/{key}")
                        offset += entries[f"{cname}/{key}"]["nbytes"]
                    else:
                        json_states[cname][key] = _checked_json(value, f"{cname}.{key}")
            f.flush()
            os.fdatasync(f.fileno())
        manifest = {"format": FORMAT, "version": VERSION, "step": step, "data_file": DATA, "data_bytes": offset,
                    "components": json_states, "tensors": entries}
        atomic_write_json(tmp / MANIFEST, manifest)
        fsync_dir(tmp)
        placed = not (root / name).exists()  # a snapshot of this step already there is replaced, never removed
        replace_dir(tmp, root / name)
        atomic_write_json(root / LATEST, {"checkpoint": name, "step": step})
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if placed and _latest_name(root) != name:  # in place but not pointed to: not a snapshot anyone reads
            shutil.rmtree(root / name, ignore_errors=True)
        for debris in root.glob(f".{LATEST}*"):  # a pointer's temporary file (atomic_write_json)
            debris.unlink(missing_ok=True)
        if made_root and not any(root.iterdir()):
            root.rmdir()
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC and not isinstance(exc, CheckpointSpaceError):
            raise CheckpointSpaceError(root, need, free_bytes(root), during_write=True) from None
        raise
    # Older snapshots, and debris of writers killed mid-save (one writer per checkpoint directory).
    for old in [*root.glob("step-*"), *root.glob(".tmp-step-*"), *root.glob(".old-step-*")]:
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    for component in components.values():
        saved = getattr(component, "checkpoint_saved", None)
        if saved is not None:
            saved(root / name)
    return root / name


def _reference(value: ReferencedTensor, key: str) -> dict:
    pieces = [[os.fspath(Path(path).absolute()), int(offset), int(nbytes)] for path, offset, nbytes in value.pieces]
    nbytes = sum(n for _, _, n in pieces)
    if nbytes != int(np.prod(value.shape, dtype=np.int64)) * torch.empty((), dtype=value.dtype).element_size():
        raise ValueError(f"{key}: its pieces hold {nbytes} bytes, not a {list(value.shape)} "
                         f"{dtype_name(value.dtype)} tensor's")
    return {"shape": list(value.shape), "dtype": dtype_name(value.dtype), "nbytes": nbytes, "pieces": pieces}


def _latest_name(root: Path) -> str | None:
    try:
        return json.loads((root / LATEST).read_text())["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def latest_step(path: str | os.PathLike) -> int | None:
    """The step of checkpoint ``path``'s LATEST snapshot; None when it has none (no directory, no pointer)."""
    try:
        return int(json.loads((Path(path) / LATEST).read_text())["step"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint pointer {Path(path) / LATEST} is unreadable ({exc})") from None


def _write_tensor(f, offset: int, value, key: str) -> dict:
    pieces = [value] if isinstance(value, torch.Tensor) else value.pieces()
    shape = list(value.shape)
    f.seek(offset)
    crc, nbytes, dtype = 0, 0, None
    for piece in pieces:
        if dtype is not None and piece.dtype != dtype:
            raise ValueError(f"{key}: pieces of dtypes {dtype_name(dtype)} and {dtype_name(piece.dtype)}")
        dtype = piece.dtype
        data = tensor_bytes(piece)
        f.write(data)
        crc = zlib.crc32(data, crc)
        nbytes += data.nbytes
    if dtype is None:  # an empty stream: a tensor of no elements
        dtype = torch.float32
    if nbytes != int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size():
        raise ValueError(f"{key}: its pieces hold {nbytes} bytes, not a {shape} {dtype_name(dtype)} tensor's")
    return {"shape": shape, "dtype": dtype_name(dtype), "offset": offset, "nbytes": nbytes, "crc32": crc}


def _checked_json(value, where: str):
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"state {where}: not JSON and not a top-level tensor ({exc})") from None
    return value


# ------------------------------------------------------------------- load
Upgrade = Callable[[dict, Path], dict]


def open_checkpoint(path: str | os.PathLike, *, upgrades: Mapping[str, Upgrade] | None = None) -> "Snapshot":
    """The snapshot of checkpoint ``path`` (its LATEST snapshot, or a snapshot directory itself), its manifest
    and data file checked. ``upgrades``: format name -> a function turning a manifest of that (older) format,
    and the snapshot's directory, into this format's manifest."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"checkpoint {root} does not exist")
    if (root / MANIFEST).exists():
        snap = root
    else:
        latest = root / LATEST
        if not latest.exists():
            raise FileNotFoundError(f"{root} is not a terastack checkpoint (no {LATEST} or {MANIFEST})")
        try:
            rel = json.loads(latest.read_text())["checkpoint"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"checkpoint pointer {latest} is unreadable ({exc})") from None
        snap = safe_relative(root, rel)
    try:
        manifest = json.loads((snap / MANIFEST).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {snap} has no {MANIFEST}") from None
    except ValueError as exc:
        raise ValueError(f"checkpoint manifest {snap / MANIFEST} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{snap / MANIFEST} is not a terastack checkpoint")
    fmt = manifest.get("format")
    if fmt != FORMAT and fmt in (upgrades or {}):
        manifest = upgrades[fmt](manifest, snap)
    elif fmt != FORMAT:
        raise ValueError(f"{snap / MANIFEST} is not a terastack checkpoint (format {fmt!r})")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{snap / MANIFEST}: checkpoint version {manifest.get('version')} (this terastack reads "
                         f"{VERSION})")
    return Snapshot(snap, manifest)


class Snapshot:
    """One snapshot of a checkpoint: ``state(name)`` is a component's state as saved (tensors as
    :class:`StoredTensor` handles); ``load(components)`` hands each its state."""

    def __init__(self, path: Path, manifest: dict):
        self.path, self.manifest = path, manifest
        self.data_path = safe_relative(path, manifest.get("data_file", DATA))
        if not self.data_path.exists():
            raise FileNotFoundError(f"checkpoint data file {self.data_path} is missing")
        size = self.data_path.stat().st_size
        if size < int(manifest.get("data_bytes", 0)):
            raise ValueError(f"checkpoint data file {self.data_path} is truncated: {size} bytes, manifest "
                             f"says {manifest['data_bytes']}")
        self._tensors: dict[str, dict[str, StoredTensor]] = {}
        for key, e in manifest.get("tensors", {}).items():
            cname, _, tkey = key.partition("/")
            dtype = DTYPES.get(e.get("dtype"))
            if dtype is None:
                raise ValueError(f"{path / MANIFEST}: {key} has dtype {e.get('dtype')!r}, which terastack does "
                                 "not read")
            if "pieces" in e:
                self._tensors.setdefault(cname, {})[tkey] = self._referenced(key, e, dtype)
                continue
            t = StoredTensor(key=key, shape=tuple(int(d) for d in e["shape"]), dtype=dtype, offset=int(e["offset"]),
                             nbytes=int(e["nbytes"]), crc32=int(e["crc32"]), snapshot=self)
            if t.nbytes != t.numel * torch.empty((), dtype=dtype).element_size():
                raise ValueError(f"checkpoint {path}: {key} holds {t.nbytes} bytes, expected "
                                 f"{t.numel * torch.empty((), dtype=dtype).element_size()}")
            if t.offset < 0 or t.offset + t.nbytes > size:
                raise ValueError(f"checkpoint data file {self.data_path} is truncated: {key} ends at byte "
                                 f"{t.offset + t.nbytes}, the file has {size}")
            self._tensors.setdefault(cname, {})[tkey] = t
        self._file = None

    def _referenced(self, key: str, e: dict, dtype: torch.dtype) -> StoredTensor:
        """A referenced tensor's handle, after checking that its files exist and hold its pieces."""
        pieces = tuple((str(p), int(o), int(n)) for p, o, n in e["pieces"])
        t = StoredTensor(key=key, shape=tuple(int(d) for d in e["shape"]), dtype=dtype, offset=0,
                         nbytes=int(e["nbytes"]), crc32=0, snapshot=self, pieces=pieces)
        if t.nbytes != t.numel * torch.empty((), dtype=dtype).element_size() or t.nbytes != sum(
                n for _, _, n in pieces):
            raise ValueError(f"checkpoint {self.path}: {key} holds {t.nbytes} bytes in pieces of "
                             f"{sum(n for _, _, n in pieces)}, expected {t.numel * t.dtype.itemsize}")
        for path, offset, nbytes in pieces:
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                raise FileNotFoundError(f"checkpoint {self.path}: {key} lies in {path}, which is missing (the "
                                        "checkpoint was written beside that store and needs it)") from None
            if offset < 0 or offset + nbytes > size:
                raise ValueError(f"checkpoint {self.path}: {key} lies in {path} up to byte {offset + nbytes}, the "
                                 f"file has {size}: it is not the store the checkpoint was written beside")
        return t

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def names(self) -> list[str]:
        return list(self.manifest["components"])

    def state(self, name: str) -> dict:
        if name not in self.manifest["components"]:
            raise ValueError(f"checkpoint {self.path} has no {name!r} (it holds {', '.join(self.names)})")
        return {**self.manifest["components"][name], **self._tensors.get(name, {})}

    def load(self, components: Mapping[str, Stateful], *, optional: Iterable[str] = ()) -> list[str]:
        """``load_state_dict`` of every component with its saved state, in the mapping's order; a component the
        snapshot lacks is an error unless named in ``optional``. Returns the names loaded."""
        optional = set(optional)
        missing = [n for n in components if n not in self.manifest["components"] and n not in optional]
        if missing:
            raise ValueError(f"checkpoint {self.path} has no {', '.join(map(repr, missing))} (it holds "
                             f"{', '.join(self.names)})")
        from terastack.io import File

        loaded = []
        with File(self.data_path, "r", direct=False) as f:
            self._file = f
            try:
                for name, component in components.items():
                    if name in self.manifest["components"]:
                        component.load_state_dict(self.state(name))
                        loaded.append(name)
            finally:
                self._file = None
        return loaded

    def read_into(self, buf: torch.Tensor, offset: int) -> None:
        """Fill byte tensor ``buf`` from the data file at ``offset``."""
        if self._file is not None:
            self._file.read(buf, offset, buf.numel())
            return
        from terastack.io import File

        with File(self.data_path, "r", direct=False) as f:
            f.read(buf, offset, buf.numel())
