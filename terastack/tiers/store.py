"""TieredStore: named tensors across device, host and SSD.

Each tensor has one :class:`TensorRecord` holding its state, its buffers, its
SSD extent and its in-flight future together. A tensor *rests* in its home
tier; ``prefetch`` brings a working copy up to the host or device tier,
``writeback`` saves a modified working copy, ``evict`` returns it to its home;
``prefetch_many``/``evict_many`` do the same for several tensors with one
request vector.

[Note: tiers without an accelerator]
Without CUDA the "device" tier is host memory with its own budget, so every
schedule runs, and every budget contract is tested, on a CPU-only machine.

[Note: buffers are padded]
Buffers of the host and device tiers are page-aligned and rounded up to 4 KiB,
and every SSD extent is 4 KiB-aligned, so transfers between them are whole
O_DIRECT blocks. A record's typed tensor is a view of the first ``nbytes``.

[Note: buffer reuse]
Freed host-memory buffers are kept in a pool per tier and size and handed out
again, because a fresh page-aligned buffer costs a page fault and a zeroed
page per 4 KiB on first touch: for a streamed 32 MiB tile that is CPU time
taken from the compute it should overlap with. Pooled bytes plus reserved
bytes never exceed the tier's budget: the pool is trimmed before a new buffer
is allocated and after a buffer is returned, so the budget still bounds
resident memory. Without an accelerator a working copy can change tiers
without a copy (see ``_move_resident``); its buffer goes back to the pool of
the tier that allocated it, so each tier's pool keeps serving its own sizes.

[Note: crash consistency]
``commit()`` writes a manifest naming each tensor's extent. Until the next
commit, a writeback never overwrites an extent named by the last manifest: it
goes to a fresh extent (copy on write) and the old one is freed at the next
commit. A crash at any point therefore leaves the last committed state intact.
"""
from __future__ import annotations

import enum
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from terastack.atomic import atomic_write_json
from terastack.io import File, IOEngine, completed, get_engine
from terastack.io.buffers import DIRECT_ALIGN, aligned_empty
from terastack.io.futures import Future
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.extents import Extent, ExtentAllocator
from terastack.units import parse_bytes, round_up

MANIFEST = "manifest.json"
DATA_FILE = "data.bin"
FORMAT_VERSION = 1
#: The data file grows by at least this much at a time (fewer fallocate calls).
_GROW_STEP = 64 << 20


class Tier(str, enum.Enum):
    DEVICE = "device"
    HOST = "host"
    SSD = "ssd"


class State(str, enum.Enum):
    ON_SSD = "on_ssd"              # only the SSD copy exists
    INFLIGHT_IN = "inflight_in"    # a working copy is being read into `tier`
    RESIDENT = "resident"          # a working copy lives in `tier`
    INFLIGHT_OUT = "inflight_out"  # the working copy (or a put) is being written to SSD


@dataclass(eq=False, slots=True)
class TensorRecord:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    home: Tier
    state: State
    tier: Tier                          # tier of the working copy (SSD while ON_SSD)
    buffer: torch.Tensor | None = None  # padded uint8 working copy in `tier`
    home_buffer: torch.Tensor | None = None  # resting copy of a HOST-home tensor
    extent: Extent | None = None        # where its bytes are on SSD
    on_disk: bool = False               # `extent` holds its current bytes
    dirty: bool = False                 # the working copy is newer than the SSD copy
    future: Future | None = None        # the transfer in flight, if any

    @property
    def padded(self) -> int:
        return max(DIRECT_ALIGN, round_up(self.nbytes, DIRECT_ALIGN))

    def view(self, raw: torch.Tensor | None = None) -> torch.Tensor:
        raw = self.buffer if raw is None else raw
        return raw[: self.nbytes].view(self.dtype).view(self.shape)


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """What callers may know of a record: a snapshot taken under the store's lock. The live
    :class:`TensorRecord` (buffers, extent, the future's bookkeeping) never leaves the store."""
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    padded: int
    home: Tier
    state: State
    tier: Tier
    on_disk: bool
    dirty: bool
    future: Future | None  # the transfer in flight, if any (futures are safe to share)


class Fetch(NamedTuple):
    """Result of :meth:`TieredStore.fetch`: the future of the tensor in the asked tier (None when a transfer
    was in flight and the caller asked not to wait behind it) and the bytes this call set moving."""
    future: Future | None
    moved_bytes: int


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in manifest")
    return dtype


class TieredStore:
    """Named tensors with a home tier, budgets per tier and asynchronous movement between tiers."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        root: str
        device_budget: int | str = 0
        host_budget: int | str = 0
        #: pinned staging for accelerator transfers
        pinned_budget: int | str = "256MiB"
        #: "auto": cuda when available, else the device tier is host memory with its own budget
        device: str = "auto"
        direct: bool | str = "auto"
        copy_on_write: bool = True

        def __post_init__(self) -> None:
            if not self.root:
                raise ValueError("root: a directory for the store's SSD files is required")
            for name in ("device_budget", "host_budget", "pinned_budget"):
                setattr(self, name, parse_bytes(getattr(self, name), field=name))
            if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
                raise ValueError(f"device: must be auto, cpu or cuda[:N]; got {self.device!r}")
            if self.device.startswith("cuda") and not torch.cuda.is_available():
                raise ValueError(f"device: {self.device!r} requested but CUDA is not available")

    def __init__(self, config: "TieredStore.Config", *, engine: IOEngine | None = None):
        self.config = config
        self.engine = engine or get_engine()
        self.device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if config.device == "auto" else config.device))
        self.budgets = {
            Tier.DEVICE: BudgetLedger("device", config.device_budget),
            Tier.HOST: BudgetLedger("host", config.host_budget),
        }
        self.pinned = BudgetLedger("pinned", config.pinned_budget)
        self.root = Path(config.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._pools: dict[Tier, dict[int, list[torch.Tensor]]] = {Tier.DEVICE: {}, Tier.HOST: {}}
        self._pooled = {Tier.DEVICE: 0, Tier.HOST: 0}
        self._moved: dict[int, Tier] = {}  # buffer address -> the tier that allocated it, for moved working copies
        self._records: dict[str, TensorRecord] = {}
        self._committed: dict[str, Extent] = {}
        self._to_free: list[Extent] = []
        self._extents = ExtentAllocator()
        manifest = self.root / MANIFEST
        data_path = self.root / DATA_FILE
        self._file = File(data_path, "r+" if data_path.exists() else "x", direct=config.direct,
                          engine=self.engine)
        self._file_size = self._file.size
        if manifest.exists():
            self._load_manifest(manifest)

    # ------------------------------------------------------------- creation
    def put(self, name: str, tensor: torch.Tensor, *, home: Tier | str = Tier.SSD) -> Future:
        """Add ``tensor`` (copied) under ``name`` resting in ``home``. Future completes when it is stored.

        Until then, ``tensor`` must not be modified (an SSD-home put writes from it directly).
        """
        home = Tier(home)
        tensor = tensor.detach()
        if tensor.device.type != "cpu" and home is Tier.SSD:
            tensor = tensor.cpu()
        tensor = tensor.contiguous()
        with self._lock:
            rec = self._new_record(name, tuple(tensor.shape), tensor.dtype, home)
            if home is Tier.SSD:
                rec.extent = self._alloc_extent(rec.padded)
                rec.state, rec.tier = State.INFLIGHT_OUT, Tier.SSD
                raw = tensor.reshape(-1).view(torch.uint8)
                fut = self._file.pwrite(raw, rec.extent.offset, rec.nbytes)
                rec.future = fut
                self._records[name] = rec

                def stored(done: Future) -> None:
                    with self._lock:
                        rec.future = None
                        rec.state = State.ON_SSD
                        rec.on_disk = done.exception() is None
                return self._track(fut, stored, rec)
            raw = self._alloc_buffer(home, rec.padded, what=f"tensor {name!r}")
            rec.view(raw).copy_(tensor)
            rec.buffer, rec.state, rec.tier, rec.dirty = raw, State.RESIDENT, home, True
            if home is Tier.HOST:
                rec.home_buffer = raw
            self._records[name] = rec
            return completed(rec.view())

    def create(self, name: str, shape, dtype: torch.dtype, *, home: Tier | str = Tier.SSD,
               tier: Tier | str | None = None) -> torch.Tensor | None:
        """A zero-filled tensor. With ``tier``, its working copy is made resident there (and returned)."""
        home = Tier(home)
        with self._lock:
            rec = self._new_record(name, tuple(int(s) for s in shape), dtype, home)
            if home is Tier.SSD:
                rec.extent = self._alloc_extent(rec.padded, zero=True)
                rec.on_disk = True
                rec.state, rec.tier = State.ON_SSD, Tier.SSD
            else:
                raw = self._alloc_buffer(home, rec.padded, what=f"tensor {name!r}", zero=True)
                rec.buffer, rec.state, rec.tier, rec.dirty = raw, State.RESIDENT, home, True
                if home is Tier.HOST:
                    rec.home_buffer = raw
            self._records[name] = rec
            if tier is not None and Tier(tier) is not rec.tier:
                target = Tier(tier)
                raw = self._alloc_buffer(target, rec.padded, what=f"tensor {name!r}",
                                         zero=rec.state is not State.RESIDENT)
                if rec.state is State.RESIDENT:
                    raw.copy_(rec.buffer)
                rec.buffer, rec.state, rec.tier, rec.dirty = raw, State.RESIDENT, target, True
            return rec.view() if rec.state is State.RESIDENT else None

    # ------------------------------------------------------------- movement
    def prefetch(self, name: str, tier: Tier | str = Tier.DEVICE) -> Future:
        """Bring a working copy of ``name`` into ``tier``; future of the typed tensor there."""
        tier = Tier(tier)
        if tier is Tier.SSD:
            raise ValueError("prefetch: tier must be device or host (use evict to send a tensor to SSD)")
        with self._lock:
            rec = self._record(name)
            if rec.future is not None:
                if rec.state is State.INFLIGHT_IN and rec.tier is tier:
                    # the read under way brings it there: join it. (A prefetch chained behind it would run late,
                    # after its caller may have used, updated and evicted the tensor, and read it back for no one.)
                    return rec.future
                return self._after(rec, lambda: self.prefetch(name, tier))
            if rec.state is State.RESIDENT and rec.tier is tier:
                return completed(rec.view())
            if rec.state is State.RESIDENT:
                return completed(self._move_resident(rec, tier))
            # ON_SSD
            raw = self._alloc_buffer(tier, rec.padded, what=f"prefetch of {name!r}")
            rec.state, rec.tier, rec.buffer, rec.dirty = State.INFLIGHT_IN, tier, raw, False
            staged = raw.device.type == "cuda"  # File.pread stages device reads through pinned memory
            if staged:
                try:
                    self.pinned.reserve(rec.padded, what=f"staging of {name!r}")
                except BaseException:
                    self._free_buffer(tier, raw)
                    rec.buffer, rec.state, rec.tier = None, State.ON_SSD, Tier.SSD
                    raise
            fut = self._file.pread(raw, rec.extent.offset, rec.padded)
            return self._track(fut, self._arrived(rec, tier, raw, staged), rec, result=lambda: rec.view(raw))

    def fetch(self, name: str, tier: Tier | str = Tier.DEVICE, *, behind_transfer: bool = True) -> Fetch:
        """:meth:`prefetch` that also says whether it set bytes moving, decided under the store's lock.

        A record already resident in ``tier`` or on its way there costs nothing (``moved_bytes == 0``). A record
        with another transfer in flight is chained behind it, or, with ``behind_transfer=False``, left alone
        (``future is None``): an advisory prefetch should not queue behind a write-back."""
        tier = Tier(tier)
        with self._lock:
            rec = self._record(name)
            if rec.future is not None and not (rec.state is State.INFLIGHT_IN and rec.tier is tier):
                if not behind_transfer:
                    return Fetch(None, 0)
            moves = rec.future is None and not (rec.state is State.RESIDENT and rec.tier is tier)
            # the store's lock is re-entrant: prefetch's decision sees the same state as ours
            return Fetch(self.prefetch(name, tier), rec.nbytes if moves else 0)

    def prefetch_many(self, names, tier: Tier | str = Tier.HOST) -> list[Future]:
        """:meth:`prefetch` of several tensors, their SSD reads submitted as one request vector (one call for
        the lot). Raises the first budget error after submitting the reads begun before it."""
        tier = Tier(tier)
        if tier is Tier.SSD:
            raise ValueError("prefetch: tier must be device or host (use evict to send a tensor to SSD)")
        out: dict[str, Future] = {}
        batch = []
        error = None
        with self._lock:
            for name in names:
                rec = self._record(name)
                if (rec.future is not None or rec.state is not State.ON_SSD
                        or (tier is Tier.DEVICE and self.device.type == "cuda")):
                    out[name] = self.prefetch(name, tier)
                    continue
                try:
                    raw = self._alloc_buffer(tier, rec.padded, what=f"prefetch of {name!r}")
                except BaseException as exc:  # noqa: BLE001 - raised once the reads begun so far are submitted
                    error = exc
                    break
                rec.state, rec.tier, rec.buffer, rec.dirty = State.INFLIGHT_IN, tier, raw, False
                batch.append((rec, raw))
            if batch:
                try:
                    fut = self._file.pread_buffers([raw for _, raw in batch], [r.extent.offset for r, _ in batch],
                                                   [r.padded for r, _ in batch])
                except BaseException:
                    for rec, raw in batch:
                        self._free_buffer(tier, raw)
                        rec.buffer, rec.state, rec.tier = None, State.ON_SSD, Tier.SSD
                    raise
                for rec, raw in batch:
                    out[rec.name] = self._track(fut, self._arrived(rec, tier, raw, False), rec,
                                                result=lambda rec=rec, raw=raw: rec.view(raw))
        if error is not None:
            raise error
        return [out[name] for name in names]

    def _arrived(self, rec: TensorRecord, tier: Tier, raw: torch.Tensor, staged: bool):
        """The completion of a read into ``raw``: resident, or back on the SSD if the read failed."""
        def arrived(done: Future) -> None:
            with self._lock:
                rec.future = None
                if staged:
                    self.pinned.release(rec.padded)
                if done.exception() is None:
                    rec.state = State.RESIDENT
                    if rec.home is Tier.HOST and tier is Tier.HOST:
                        rec.home_buffer = raw
                else:
                    self._free_buffer(tier, rec.buffer)
                    rec.buffer, rec.state, rec.tier = None, State.ON_SSD, Tier.SSD
        return arrived

    def get(self, name: str, tier: Tier | str = Tier.DEVICE, *, timeout: float | None = None) -> torch.Tensor:
        return self.prefetch(name, tier).result(timeout)

    def tensor(self, name: str) -> torch.Tensor:
        """The resident working copy (raises if ``name`` is not resident)."""
        with self._lock:
            rec = self._record(name)
            if rec.state is not State.RESIDENT:
                raise RuntimeError(f"tensor {name!r} is {rec.state.value}, not resident; prefetch it first")
            return rec.view()

    def mark_dirty(self, name: str) -> None:
        with self._lock:
            rec = self._record(name)
            if rec.buffer is None:
                raise RuntimeError(f"tensor {name!r} has no working copy to mark dirty")
            rec.dirty = True

    def writeback(self, name: str) -> Future:
        """Save the working copy to the tensor's home (SSD or host); it stays resident."""
        with self._lock:
            rec = self._record(name)
            if rec.future is not None:
                return self._after(rec, lambda: self.writeback(name))
            if rec.state is not State.RESIDENT or (not rec.dirty and (rec.on_disk or rec.home is not Tier.SSD)):
                return completed(None)
            if rec.home is Tier.HOST:
                if rec.tier is Tier.DEVICE:
                    rec.home_buffer.copy_(rec.buffer)
                rec.dirty = False
                return completed(None)
            if rec.home is Tier.DEVICE:
                return completed(None)
            return self._write_out(rec)

    def evict(self, name: str) -> Future:
        """Move ``name`` down to its home tier, writing it back first if modified; frees the working copy."""
        with self._lock:
            rec = self._record(name)
            if rec.future is not None:
                return self._after(rec, lambda: self.evict(name))
            if rec.state is State.ON_SSD or rec.tier is rec.home:
                return completed(None)
            if rec.home is Tier.HOST:
                if rec.home_buffer is None:
                    rec.home_buffer = self._alloc_buffer(Tier.HOST, rec.padded, what=f"evict of {name!r}")
                    rec.dirty = True
                if rec.dirty:
                    rec.home_buffer.copy_(rec.buffer)
                self._free_buffer(rec.tier, rec.buffer)
                rec.buffer, rec.tier, rec.dirty = rec.home_buffer, Tier.HOST, False
                return completed(None)
            # SSD home
            if rec.dirty or not rec.on_disk:
                written = self._write_out(rec)
                return written.then(lambda _: self._drop_working_copy(name))
            self._drop_working_copy(name)
            return completed(None)

    def evict_many(self, names) -> list[Future]:
        """:meth:`evict` of several tensors, the writes of those resting on the SSD submitted as one request
        vector."""
        out: dict[str, Future] = {}
        batch = []
        with self._lock:
            for name in names:
                rec = self._record(name)
                if (rec.future is not None or rec.home is not Tier.SSD or rec.state is not State.RESIDENT
                        or not (rec.dirty or not rec.on_disk) or rec.buffer.device.type != "cpu"):
                    out[name] = self.evict(name)
                    continue
                self._claim_extent(rec)
                batch.append(rec)
            if batch:
                fut = self._file.pwrite_buffers([r.buffer for r in batch], [r.extent.offset for r in batch],
                                                [r.padded for r in batch])
                for rec in batch:
                    rec.state, rec.dirty = State.INFLIGHT_OUT, False
                    written = self._track(fut, self._written(rec, None), rec)
                    out[rec.name] = written.then(lambda _, n=rec.name: self._drop_working_copy(n))
        return [out[name] for name in names]

    def delete(self, name: str) -> None:
        with self._lock:
            rec = self._record(name)
            if rec.future is not None:
                rec.future.result()
            if rec.buffer is not None:
                self._free_buffer(rec.tier, rec.buffer)
            if rec.home_buffer is not None and rec.home_buffer is not rec.buffer:
                self._free_buffer(Tier.HOST, rec.home_buffer)
            if rec.extent is not None and self._committed.get(name) != rec.extent:
                self._extents.free(rec.extent)
            del self._records[name]

    # ---------------------------------------------------------- persistence
    def commit(self) -> Path:
        """Write back everything modified, make it durable and record it in the manifest (atomically)."""
        with self._lock:
            names = list(self._records)
        for name in names:
            rec = self._records[name]
            if rec.home is not Tier.SSD and rec.state is State.RESIDENT:
                self._persist_resident(rec)
            else:
                self.writeback(name).result()
        self.wait()
        with self._lock:
            self._file.sync()
            entries = {}
            for name, rec in self._records.items():
                if rec.extent is None or not rec.on_disk:
                    raise RuntimeError(f"tensor {name!r} has no SSD copy at commit")
                entries[name] = {"shape": list(rec.shape), "dtype": _dtype_name(rec.dtype), "nbytes": rec.nbytes,
                                 "home": rec.home.value, "offset": rec.extent.offset,
                                 "capacity": rec.extent.capacity}
            path = atomic_write_json(self.root / MANIFEST, {
                "format": "terastack.tiers", "version": FORMAT_VERSION, "data_file": DATA_FILE,
                "data_bytes": self._extents.end, "tensors": entries})
            # Extents replaced since the last commit are unreferenced now.
            for ext in self._to_free:
                self._extents.free(ext)
            self._to_free.clear()
            self._committed = {name: rec.extent for name, rec in self._records.items()}
            return path

    def wait(self, timeout: float | None = None) -> None:
        """Block until no transfer of this store is in flight."""
        while True:
            with self._lock:
                pending = [rec.future for rec in self._records.values() if rec.future is not None]
            if not pending:
                return
            for fut in pending:
                fut.exception(timeout)

    def close(self) -> None:
        """Wait for transfers and close the data file. Uncommitted changes are not persisted."""
        self.wait()
        with self._lock:
            for rec in self._records.values():
                if rec.buffer is not None:
                    self._free_buffer(rec.tier, rec.buffer)
                if rec.home_buffer is not None and rec.home_buffer is not rec.buffer:
                    self._free_buffer(Tier.HOST, rec.home_buffer)
                rec.buffer = rec.home_buffer = None
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> "TieredStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def trim(self) -> int:
        """Return every pooled (free, reusable) buffer to the OS; the bytes released."""
        with self._lock:
            released = sum(self._pooled.values())
            for tier in self._pools:
                self._trim_pool(tier, 0)
            return released

    # -------------------------------------------------------------- queries
    def __contains__(self, name: str) -> bool:
        return name in self._records

    def __len__(self) -> int:
        return len(self._records)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def record(self, name: str) -> RecordInfo:
        """A snapshot of ``name``'s record (state, tier, sizes), consistent at the moment of the call."""
        with self._lock:
            rec = self._record(name)
            return RecordInfo(name=rec.name, shape=rec.shape, dtype=rec.dtype, nbytes=rec.nbytes,
                              padded=rec.padded, home=rec.home, state=rec.state, tier=rec.tier,
                              on_disk=rec.on_disk, dirty=rec.dirty, future=rec.future)

    def usage(self) -> dict:
        out = {tier.value: ledger.snapshot() for tier, ledger in self.budgets.items()}
        out["pinned"] = self.pinned.snapshot()
        out["ssd"] = {"used": self._extents.end}
        return out

    # -------------------------------------------------------------- helpers
    def _record(self, name: str) -> TensorRecord:
        try:
            return self._records[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in the store at {self.root}") from None

    def _new_record(self, name: str, shape, dtype, home: Tier) -> TensorRecord:
        if name in self._records:
            raise KeyError(f"tensor {name!r} already exists in the store at {self.root}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        return TensorRecord(name=name, shape=shape, dtype=dtype, nbytes=nbytes, home=home,
                            state=State.ON_SSD, tier=Tier.SSD)

    def _alloc_buffer(self, tier: Tier, padded: int, *, what: str, zero: bool = False) -> torch.Tensor:
        """A padded buffer in ``tier``, reserved against its budget. See [Note: buffer reuse]."""
        ledger = self.budgets[tier]
        ledger.reserve(padded, what=what)
        try:
            if tier is Tier.DEVICE and self.device.type == "cuda":
                raw = torch.empty(padded, dtype=torch.uint8, device=self.device)
                return raw.zero_() if zero else raw
            with self._lock:
                pool = self._pools[tier].get(padded)
                if pool:
                    self._pooled[tier] -= padded
                    raw = pool.pop()
                    if not pool:
                        del self._pools[tier][padded]
                    return raw.zero_() if zero else raw
                self._trim_pool(tier, ledger.limit - ledger.used)
            return aligned_empty(padded, torch.uint8, as_tensor=True)
        except BaseException:
            ledger.release(padded)
            raise

    def _trim_pool(self, tier: Tier, room: int) -> None:
        """Drop pooled buffers of ``tier`` until at most ``room`` bytes stay pooled."""
        pools = self._pools[tier]
        while self._pooled[tier] > room and pools:
            size = max(pools)
            pools[size].pop()
            self._pooled[tier] -= size
            if not pools[size]:
                del pools[size]

    def _free_buffer(self, tier: Tier, raw: torch.Tensor) -> None:
        self.budgets[tier].release(raw.numel())
        if raw.device.type == "cpu":
            with self._lock:
                # back to the pool of the tier that allocated it (it may have moved, see _move_resident)
                home = self._moved.pop(raw.data_ptr(), tier)
                self._pools[home].setdefault(raw.numel(), []).append(raw)
                self._pooled[home] += raw.numel()
                self._trim_pool(home, self.budgets[home].limit - self.budgets[home].used)

    def _alloc_extent(self, padded: int, *, zero: bool = False) -> Extent:
        ext = self._extents.alloc(padded)
        end = ext.offset + ext.capacity
        if end > self._file_size:
            new_size = max(end, self._file_size + _GROW_STEP) if not zero else end
            self._file.allocate(new_size)
            self._file_size = new_size
        return ext

    def _write_out(self, rec: TensorRecord) -> Future:
        """Write the working copy to SSD (a fresh extent if the current one is committed)."""
        self._claim_extent(rec)
        source = rec.buffer
        staged = None
        if source.device.type == "cuda":
            # Device copies are staged through pinned host memory (File.pwrite does it on a side stream).
            self.pinned.reserve(rec.padded, what=f"staging of {rec.name!r}")
            staged = rec.padded
        rec.state, rec.dirty = State.INFLIGHT_OUT, False
        fut = self._file.pwrite(source, rec.extent.offset, rec.padded)
        return self._track(fut, self._written(rec, staged), rec)

    def _claim_extent(self, rec: TensorRecord) -> None:
        """Give ``rec`` an extent to write to: its own, or a fresh one if the current one is committed."""
        if rec.extent is None or (self.config.copy_on_write and self._committed.get(rec.name) == rec.extent):
            if rec.extent is not None:
                self._to_free.append(rec.extent)
            rec.extent = self._alloc_extent(rec.padded)

    def _written(self, rec: TensorRecord, staged: int | None):
        """The completion of a write of ``rec``: on disk, or still dirty if the write failed."""
        def written(done: Future) -> None:
            with self._lock:
                rec.future = None
                rec.state = State.RESIDENT
                if staged:
                    self.pinned.release(staged)
                if done.exception() is None:
                    rec.on_disk = True
                else:
                    rec.dirty = True
        return written

    def _persist_resident(self, rec: TensorRecord) -> None:
        """Host- and device-home tensors get an SSD copy at commit so the manifest covers them."""
        if rec.home is Tier.HOST and rec.tier is Tier.DEVICE and rec.dirty:
            rec.home_buffer.copy_(rec.buffer)
        if rec.dirty or not rec.on_disk:
            saved_buffer = rec.buffer
            if rec.home is Tier.HOST:
                rec.buffer = rec.home_buffer
            try:
                self._write_out(rec).result()
            finally:
                rec.buffer = saved_buffer

    def _drop_working_copy(self, name: str) -> None:
        with self._lock:
            rec = self._records[name]
            if rec.buffer is not None:
                self._free_buffer(rec.tier, rec.buffer)
            rec.buffer, rec.state, rec.tier = None, State.ON_SSD, Tier.SSD

    def _move_resident(self, rec: TensorRecord, tier: Tier) -> torch.Tensor:
        """Copy a resident working copy between host and device, releasing the old one unless it is home."""
        if self.device.type != "cuda" and rec.home_buffer is None:
            # [Note: tiers without an accelerator] both tiers are host memory: the working copy changes
            # ledgers, not places (no copy, no second buffer).
            self.budgets[tier].reserve(rec.padded, what=f"move of {rec.name!r} to {tier.value}")
            self.budgets[rec.tier].release(rec.padded)
            with self._lock:
                self._moved.setdefault(rec.buffer.data_ptr(), rec.tier)
            rec.tier = tier
            return rec.view()
        raw = self._alloc_buffer(tier, rec.padded, what=f"move of {rec.name!r} to {tier.value}")
        raw.copy_(rec.buffer, non_blocking=False)
        if rec.buffer is not rec.home_buffer:
            self._free_buffer(rec.tier, rec.buffer)
        rec.buffer, rec.tier = raw, tier
        return rec.view()

    def _after(self, rec: TensorRecord, then) -> Future:
        """Run ``then()`` once the record's in-flight transfer finishes; forward its future's outcome."""
        out = Future()

        def chain(_) -> None:
            try:
                inner = then()
                inner.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception()
                                        else out.set_result(f.result()))
            except BaseException as exc:  # noqa: BLE001
                out.set_exception(exc)
        rec.future.add_done_callback(chain)
        return out

    def _track(self, fut: Future, on_done, rec: TensorRecord, result=None) -> Future:
        """The record's public future: state updated by ``on_done`` first, then the caller is told."""
        out = Future()
        rec.future = out

        def finish(done: Future) -> None:
            on_done(done)
            exc = done.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(result() if result else None)
        fut.add_done_callback(finish)
        return out

    def _load_manifest(self, path: Path) -> None:
        import json

        try:
            manifest = json.loads(path.read_text())
            if manifest.get("format") != "terastack.tiers":
                raise ValueError("not a terastack store manifest")
            if manifest.get("version") != FORMAT_VERSION:
                raise ValueError(f"store format version {manifest.get('version')} (this terastack reads "
                                 f"{FORMAT_VERSION})")
            if manifest.get("data_file") != DATA_FILE:
                raise ValueError(f"unexpected data file {manifest.get('data_file')!r}")
            tensors = manifest["tensors"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"store manifest {path} is unreadable: {exc}") from None
        size = self._file_size
        used = []
        for name, entry in tensors.items():
            try:
                shape = tuple(int(s) for s in entry["shape"])
                dtype = _dtype_from_name(entry["dtype"])
                ext = Extent(int(entry["offset"]), int(entry["capacity"]))
                home = Tier(entry["home"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"store manifest {path}: entry {name!r} is malformed ({exc})") from None
            rec = TensorRecord(name=name, shape=shape, dtype=dtype, nbytes=int(entry["nbytes"]), home=home,
                               state=State.ON_SSD, tier=Tier.SSD, extent=ext, on_disk=True)
            expected = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
            if rec.nbytes != expected or ext.offset % DIRECT_ALIGN or ext.capacity < rec.padded:
                raise ValueError(f"store manifest {path}: entry {name!r} has inconsistent sizes")
            if ext.offset + ext.capacity > size:
                raise ValueError(f"store data file {self.root / DATA_FILE} is truncated: tensor {name!r} needs "
                                 f"bytes up to {ext.offset + ext.capacity}, file has {size}")
            self._records[name] = rec
            used.append(ext)
        self._extents.end = max(int(manifest.get("data_bytes", 0)), max((e.offset + e.capacity for e in used),
                                                                        default=0))
        self._extents.rebuild_free_list(used)
        self._committed = {name: rec.extent for name, rec in self._records.items()}


@dataclass(frozen=True, slots=True)
class Placement:
    """A frozen placement policy: the home tier for each tensor name (first matching pattern wins)."""

    rules: tuple[tuple[str, Tier], ...] = ()
    default: Tier = Tier.SSD
    notes: dict = field(default_factory=dict, compare=False)

    def home_for(self, name: str) -> Tier:
        import fnmatch

        for pattern, tier in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return Tier(tier)
        return self.default
