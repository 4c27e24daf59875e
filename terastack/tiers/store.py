"""TieredStore: named tensors across device, host and SSD.

Each tensor has one :class:`~terastack.tiers.record.TensorRecord` holding its
state, its buffers, its SSD extent and its in-flight future together (see
[Note: record states] in terastack.tiers.record). A tensor *rests* in its home
tier; ``prefetch`` brings a working copy up to the host or device tier,
``writeback`` saves a modified working copy, ``evict`` returns it to its home;
``prefetch_many``/``evict_many`` do the same for several tensors with one
request vector per directory.

The store is a facade over three parts, each in its own module:

- ``record``: the per-tensor state machine and the snapshot callers see;
- ``pool``: the working buffers of the host and device tiers, within their
  budgets ([Note: buffer reuse]);
- ``layout``: the data files (one per directory, one directory per SSD), the
  extents in them, and the manifest ([Note: store layout], [Note: crash
  consistency]); where a new extent goes is the placement policy's choice
  ([Note: placement over directories] in terastack.tiers.placement);
- ``versions``: the commits kept (the last one and pinned ones) and the old
  extents held for them ([Note: versions and commits]); ``commits``: the
  store's operations on them (commit, revert, pin and release).

Only the store's lock orders changes to records; the pool and the layout
have their own locks and never call back into the store.

[Note: tiers without an accelerator]
Without CUDA the "device" tier is host memory with its own budget, so every
schedule runs, and every budget contract is tested, on a CPU-only machine.
"""
from __future__ import annotations

import threading
from pathlib import Path

import torch

from terastack.io import IOEngine, completed, get_engine
from terastack.io.cuda import PinnedStaging
from terastack.io.staged import staged_transfer
from terastack.io.futures import Future
from terastack.io.requests import OP_READ, OP_WRITE
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.commits import StoreCommits
from terastack.tiers.transfers import StoreTransfers
from terastack.tiers.layout import StoreLayout
from terastack.tiers.placement import PlacementPolicy, StripeBySize
from terastack.tiers.pool import BufferPool
from terastack.tiers.record import Fetch, RecordInfo, State, TensorRecord, Tier, tensor_nbytes
# resolve_store_device and split_dirs: public here as before
from terastack.tiers.store_config import StoreConfig, resolve_store_device, split_dirs  # noqa: F401


class TieredStore(StoreCommits, StoreTransfers):
    """Named tensors with a home tier, budgets per tier and asynchronous movement between tiers; its commits
    (durable, atomic, some pinned) are :class:`~terastack.tiers.commits.StoreCommits`', the completions of its
    transfers :class:`~terastack.tiers.transfers.StoreTransfers`'."""

    Config = StoreConfig

    def __init__(self, config: "TieredStore.Config", *, engine: IOEngine | None = None,
                 placement: PlacementPolicy | None = None):
        """``placement``: where new extents go over ``config.dirs``; by default :class:`StripeBySize` weighted
        by ``config.bandwidths``."""
        self.config = config
        self.engine = engine or get_engine()
        self.device = resolve_store_device(config.device)
        self.budgets = {
            Tier.DEVICE: BudgetLedger("device", config.device_budget),
            Tier.HOST: BudgetLedger("host", config.host_budget),
        }
        # [Note: pinned staging] in terastack.io.cuda: chunks allocated on first use (never without CUDA), their
        # bytes reserved in the host ledger, since page-locked memory is host memory the budget must bound
        self.pinned = PinnedStaging(config.pinned_budget, pin=self.device.type == "cuda",
                                    ledger=self.budgets[Tier.HOST])
        if self.device.type == "cuda" and config.device_budget > 0:
            # one chunk taken now: staging can always make progress, however full the host ledger gets later
            # (and a host budget without room for it is refused here, naming the budget). A store without a
            # device tier never stages.
            self.pinned.release(self.pinned.acquire())
        self.pool = BufferPool(self.budgets, self.device)
        #: called as ``traffic(record, op, nbytes)`` (op "read" or "write") for every SSD transfer of a record the
        #: store submits: a caller's account of its bytes by kind (the LLM engine's byte ledger); None: not called
        self.traffic = None
        self.placement = placement if placement is not None else StripeBySize(weights=tuple(config.bandwidths))
        self._lock = threading.RLock()
        self._layout = StoreLayout(config.dirs, placement=self.placement, direct=config.direct, engine=self.engine)
        try:
            self._records: dict[str, TensorRecord]
            self._records, self._versions = self._layout.load()
        except BaseException:
            self._layout.close()
            raise

    @property
    def root(self) -> Path:
        """The first directory: it holds the manifest."""
        return self._layout.root

    @property
    def dirs(self) -> tuple[Path, ...]:
        """Every directory of the store (one per SSD), in the order the manifest numbers them."""
        return self._layout.dirs

    # ------------------------------------------------------------- creation
    def put(self, name: str, tensor: torch.Tensor, *, home: Tier | str = Tier.SSD) -> Future:
        """Add ``tensor`` (copied) under ``name`` resting in ``home``. Future completes when it is stored.

        Until then, ``tensor`` must not be modified (an SSD-home put writes from it directly).
        """
        home = Tier(home)
        tensor = tensor.detach()
        if tensor.device.type not in ("cpu", "cuda") and home is Tier.SSD:
            tensor = tensor.cpu()
        tensor = tensor.contiguous()
        with self._lock:
            rec = self._new_record(name, tuple(tensor.shape), tensor.dtype, home)
            if home is Tier.SSD:
                rec.extent = self._layout.alloc(rec.padded)
                rec.state, rec.tier = State.INFLIGHT_OUT, Tier.SSD
                raw = tensor.reshape(-1).view(torch.uint8)
                file = self._layout.file(rec.extent)
                # a device tensor: staged, not copied on the caller's thread ([Note: stream order of staged transfers])
                fut = (staged_transfer(file, OP_WRITE, raw, rec.extent.offset, rec.nbytes, staging=self.pinned)
                       if raw.device.type == "cuda" else file.pwrite(raw, rec.extent.offset, rec.nbytes))
                self._count(rec, "write", rec.nbytes)
                rec.future = fut
                self._records[name] = rec

                def stored(done: Future) -> None:
                    with self._lock:
                        rec.future = None
                        rec.state = State.ON_SSD
                        rec.on_disk = done.exception() is None
                return self._track(fut, stored, rec)
            raw = self.pool.alloc(home, rec.padded, what=f"tensor {name!r}")
            rec.view(raw).copy_(tensor)
            rec.hold(raw, home)
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
                rec.extent = self._layout.alloc(rec.padded, zero=True)
                rec.on_disk = True
                rec.state, rec.tier = State.ON_SSD, Tier.SSD
            else:
                raw = self.pool.alloc(home, rec.padded, what=f"tensor {name!r}", zero=True)
                rec.hold(raw, home)
                if home is Tier.HOST:
                    rec.home_buffer = raw
            self._records[name] = rec
            if tier is not None and Tier(tier) is not rec.tier:
                target = Tier(tier)
                raw = self.pool.alloc(target, rec.padded, what=f"tensor {name!r}",
                                      zero=rec.state is not State.RESIDENT)
                if rec.state is State.RESIDENT:
                    raw.copy_(rec.buffer)
                rec.hold(raw, target)
            return rec.view() if rec.state is State.RESIDENT else None

    # ------------------------------------------------------------- movement
    def prefetch(self, name: str, tier: Tier | str = Tier.DEVICE) -> Future:
        """Bring a working copy of ``name`` into ``tier``; future of the typed tensor there."""
        tier = _working_tier(tier)
        with self._lock:
            rec = self._record(name)
            if rec.future is not None:
                if rec.state is State.INFLIGHT_IN and rec.tier is tier:
                    # the read under way brings it there: join it. (A prefetch chained behind it would run late,
                    # after its caller may have used, updated and evicted the tensor, and read it back for no one.)
                    return rec.future
                return self._after(rec, lambda: self.prefetch(name, tier))
            if rec.state is State.RESIDENT and rec.tier is tier:
                self.pool.settle(rec.buffer)  # an upload may still read it ([Note: pinned host tier])
                return completed(rec.view())
            if rec.state is State.RESIDENT:
                return self._move_resident(rec, tier)
            # ON_SSD
            raw = self.pool.alloc(tier, rec.padded, what=f"prefetch of {name!r}")
            rec.start_read(raw, tier)
            file = self._layout.file(rec.extent)
            try:
                if raw.device.type == "cuda":
                    fut = staged_transfer(file, OP_READ, raw, rec.extent.offset, rec.padded, staging=self.pinned)
                else:
                    fut = file.pread(raw, rec.extent.offset, rec.padded)
                self._count(rec, "read", rec.padded)
            except BaseException:
                self.pool.free(tier, raw)
                rec.rest_on_ssd()
                raise
            return self._track(fut, self._arrived(rec, tier, raw), rec, result=lambda: rec.view(raw))

    def resident(self, name: str, tier: Tier | str = Tier.DEVICE) -> torch.Tensor | None:
        """The working copy of ``name`` if it is resident in ``tier`` with no transfer in flight, else None:
        what :meth:`prefetch` would return finished, without the future (for callers asking for many tensors
        that are usually resident)."""
        tier = _working_tier(tier)
        with self._lock:
            rec = self._record(name)
            if rec.future is None and rec.state is State.RESIDENT and rec.tier is tier:
                self.pool.settle(rec.buffer)  # an upload may still read it ([Note: pinned host tier])
                return rec.view()
        return None

    def padded(self, name: str) -> int:
        """The bytes ``name`` takes in a tier (its size padded for direct I/O)."""
        with self._lock:
            return self._record(name).padded

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
        """:meth:`prefetch` of several tensors, their SSD reads submitted as one request vector per directory
        (one call for the lot on a one-directory store). Raises the first budget error after submitting the
        reads begun before it."""
        tier = _working_tier(tier)
        out: dict[str, Future] = {}
        batch: list[tuple[TensorRecord, torch.Tensor]] = []
        error = None
        with self._lock:
            for name in names:
                rec = self._record(name)
                if (rec.future is not None or rec.state is not State.ON_SSD
                        or (tier is Tier.DEVICE and self.device.type == "cuda")):
                    out[name] = self.prefetch(name, tier)
                    continue
                try:
                    raw = self.pool.alloc(tier, rec.padded, what=f"prefetch of {name!r}")
                except BaseException as exc:  # noqa: BLE001 - raised once the reads begun so far are submitted
                    error = exc
                    break
                rec.start_read(raw, tier)
                batch.append((rec, raw))
            failure = None
            for d, group in _by_dir(batch).items():
                try:
                    fut = self._layout.files[d].pread_buffers([raw for _, raw in group],
                                                              [r.extent.offset for r, _ in group],
                                                              [r.padded for r, _ in group])
                except BaseException as exc:  # noqa: BLE001 - the other directories' reads still go out
                    for rec, raw in group:
                        self.pool.free(tier, raw)
                        rec.rest_on_ssd()
                    failure = failure or exc
                    continue
                for rec, raw in group:
                    self._count(rec, "read", rec.padded)
                    out[rec.name] = self._track(fut, self._arrived(rec, tier, raw), rec,
                                                result=lambda rec=rec, raw=raw: rec.view(raw))
            if failure is not None:
                raise failure
        if error is not None:
            raise error
        return [out[name] for name in names]

    def _arrived(self, rec: TensorRecord, tier: Tier, raw: torch.Tensor):
        """The completion of a read into ``raw``: resident, or back on the SSD if the read failed."""
        def arrived(done: Future) -> None:
            with self._lock:
                rec.future = None
                if done.exception() is None:
                    rec.state = State.RESIDENT
                    if rec.home is Tier.HOST and tier is Tier.HOST:
                        rec.home_buffer = raw
                else:
                    self.pool.free(tier, rec.buffer)
                    rec.rest_on_ssd()
        return arrived

    def get(self, name: str, tier: Tier | str = Tier.DEVICE, *, timeout: float | None = None) -> torch.Tensor:
        return self.prefetch(name, tier).result(timeout)

    def tensor(self, name: str) -> torch.Tensor:
        """The resident working copy (raises if ``name`` is not resident)."""
        with self._lock:
            rec = self._record(name)
            if rec.state is not State.RESIDENT:
                raise RuntimeError(f"tensor {name!r} is {rec.state.value}, not resident; prefetch it first")
            self.pool.settle(rec.buffer)  # an upload may still read it ([Note: pinned host tier])
            return rec.view()

    def mark_dirty(self, name: str) -> None:
        with self._lock:
            _mark_dirty(self._record(name))

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
                    rec.home_buffer = self.pool.alloc(Tier.HOST, rec.padded, what=f"evict of {name!r}")
                    rec.dirty = True
                if rec.dirty:
                    rec.home_buffer.copy_(rec.buffer)
                self.pool.free(rec.tier, rec.buffer)
                rec.switch_buffer(rec.home_buffer, Tier.HOST)
                rec.dirty = False
                return completed(None)
            # SSD home
            if rec.dirty or not rec.on_disk:
                return self._write_out(rec, drop=True)
            self._drop_working_copy(name)
            return completed(None)

    def evict_many(self, names, *, dirty: bool = False) -> list[Future]:
        """:meth:`evict` of several tensors, the writes of those resting on the SSD submitted as one request
        vector per directory. ``dirty``: their working copies were modified (:meth:`mark_dirty` for each)."""
        out: dict[str, Future] = {}
        batch: list[tuple[TensorRecord, torch.Tensor]] = []
        with self._lock:
            for name in names:
                rec = self._record(name)
                if dirty:
                    _mark_dirty(rec)
                if (rec.future is not None or rec.home is not Tier.SSD or rec.state is not State.RESIDENT
                        or not (rec.dirty or not rec.on_disk) or rec.buffer.device.type != "cpu"):
                    out[name] = self.evict(name)
                    continue
                self._claim_extent(rec)
                batch.append((rec, rec.buffer))
            for d, group in _by_dir(batch).items():
                fut = self._layout.files[d].pwrite_buffers([raw for _, raw in group],
                                                           [r.extent.offset for r, _ in group],
                                                           [r.padded for r, _ in group])
                for rec, _ in group:
                    self._count(rec, "write", rec.padded)
                    rec.state, rec.dirty = State.INFLIGHT_OUT, False
                    out[rec.name] = self._track(fut, self._written(rec, drop=True), rec)
        return [out[name] for name in names]

    def delete(self, name: str) -> None:
        """Forget ``name``: its buffers are freed, and its extent too unless a kept commit names it."""
        while True:
            with self._lock:
                rec = self._record(name)
                pending = rec.future
                if pending is None:
                    if rec.buffer is not None:
                        self.pool.free(rec.tier, rec.buffer)
                    if rec.home_buffer is not None and rec.home_buffer is not rec.buffer:
                        self.pool.free(Tier.HOST, rec.home_buffer)
                    if rec.extent is not None and self._versions.moved_off(rec.extent):
                        self._layout.free(rec.extent)
                    del self._records[name]
                    return
            # wait outside the lock: the transfer's completion takes it to publish the record's new state
            pending.result()

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
        """Wait for transfers and close the data files. Uncommitted changes are not persisted."""
        self.wait()
        self.pool.settle_all()  # copies between the tiers still using host buffers
        with self._lock:
            for rec in self._records.values():
                if rec.buffer is not None:
                    self.pool.free(rec.tier, rec.buffer)
                if rec.home_buffer is not None and rec.home_buffer is not rec.buffer:
                    self.pool.free(Tier.HOST, rec.home_buffer)
                rec.switch_buffer(None, rec.tier)
                rec.home_buffer = None
            self.pinned.close()
            self._layout.close()

    def __enter__(self) -> "TieredStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def trim(self) -> int:
        """Return every pooled (free, reusable) buffer to the OS; the bytes released."""
        return self.pool.trim()

    # -------------------------------------------------------------- queries
    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._records

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def record(self, name: str) -> RecordInfo:
        """A snapshot of ``name``'s record (state, tier, sizes), consistent at the moment of the call."""
        with self._lock:
            return self._record(name).info()

    def usage(self) -> dict:
        """Ledger use and peaks per tier; for "ssd", bytes used (and live) per directory and in total."""
        out = {tier.value: ledger.snapshot() for tier, ledger in self.budgets.items()}
        out["pinned"] = self.pinned.snapshot()
        out["ssd"] = self._layout.usage()
        with self._lock:
            # extents allocated only for a kept commit: beyond the records' own bytes
            out["ssd"]["held"] = self._versions.held_bytes()
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
        return TensorRecord(name=name, shape=shape, dtype=dtype, nbytes=tensor_nbytes(shape, dtype), home=home,
                            state=State.ON_SSD, tier=Tier.SSD)


def _mark_dirty(rec: TensorRecord) -> None:
    """The working copy of ``rec`` is newer than its resting copy (call under the store's lock)."""
    if rec.buffer is None:
        raise RuntimeError(f"tensor {rec.name!r} has no working copy to mark dirty")
    rec.dirty = True


def _working_tier(tier: Tier | str) -> Tier:
    """``tier`` as a Tier a working copy may live in (device or host)."""
    if tier.__class__ is not Tier:
        tier = Tier(tier)
    if tier is Tier.SSD:
        raise ValueError("prefetch: tier must be device or host (use evict to send a tensor to SSD)")
    return tier


def _by_dir(batch: list[tuple[TensorRecord, torch.Tensor]]) -> dict[int, list[tuple[TensorRecord, torch.Tensor]]]:
    """``batch`` grouped by the directory of each record's extent, in order: one request vector per data file."""
    groups: dict[int, list[tuple[TensorRecord, torch.Tensor]]] = {}
    for rec, raw in batch:
        groups.setdefault(rec.extent.dir, []).append((rec, raw))
    return groups
