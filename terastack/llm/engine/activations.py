"""Saved activations of one unit: kept on the device, swapped to host memory, or swapped to the SSD.

A unit's forward runs under ``torch.autograd.graph.saved_tensors_hooks``.
Every tensor autograd saves passes through :meth:`ActivationStash.pack`:

* a view of one of the unit's weights is saved as a *reference* (name, size,
  stride, offset): the weight's working copy is released after forward and
  fetched again for backward, so the graph never pins it;
* anything else is an activation. It is saved by *storage* (all views of one
  buffer, such as q, k and v split from one projection, share one entry) and,
  by the unit's :class:`Swap` (the runtime side of where its activation spec
  says they rest: :class:`KeepOnDevice`, :class:`SwapToHost`,
  :class:`SwapToSsd`), kept, copied to host memory, or written to the SSD
  through the store; backward gets it back as a view with the original size
  and strides.

Byte accounting: kept activations and activations on their way to or from the
SSD are charged to the device ledger, host copies to the host ledger, so the
budgets cover them (see the planner's memory model).

[Note: host copies in the store's buffers]
A storage swapped to host memory is copied into a host-tier buffer of the
store's pool (:class:`terastack.tiers.pool.BufferPool`: page-locked with an
accelerator, reserved in the host ledger at its padded size, handed out again
after the unit's backward), not into a block of PyTorch's pinned allocator,
which rounds up to a power of two and keeps freed blocks outside the ledger.
The download runs on the store's download stream; the copy back waits for it,
and the buffer is fenced by the copy back, so the pool hands it out again only
once that copy has read it ([Note: pinned host tier] in terastack.tiers.pool).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import torch

from terastack.constants import padded_size
from terastack.io.cuda import to_host
from terastack.io.futures import Future
from terastack.llm.engine import records
from terastack.tiers import Tier


@dataclass(frozen=True, slots=True)
class _WeightRef:
    local: str
    size: tuple
    stride: tuple
    offset: int


@dataclass(frozen=True, slots=True)
class _SavedView:
    key: int
    dtype: torch.dtype
    size: tuple
    stride: tuple
    offset: int


class Entry:
    """One saved storage: its bytes in some tier, and what they are charged to."""

    __slots__ = ("nbytes", "tensor", "on_device", "record", "write", "charged", "buffer", "ready")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.tensor: torch.Tensor | None = None     # kept / host copy (uint8 over the storage)
        self.on_device: torch.Tensor | None = None  # brought back for backward (host copy on an accelerator, SSD)
        self.record: str | None = None              # store record (SSD policy)
        self.write: Future | None = None
        self.charged: list[tuple] = []               # (ledger, nbytes) to release when freed
        self.buffer: torch.Tensor | None = None      # the pool's host buffer holding the host copy (SwapToHost)
        self.ready = None                            # the event of the download into ``buffer``


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of ``t``."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


_names = itertools.count()


class ActivationStash:
    """Saved tensors of one unit forward, kept or swapped by ``swap``."""

    def __init__(self, runtime, unit, swap: "Swap", weights: dict[str, torch.Tensor]):
        self.runtime = runtime                      # gives store, ledgers, device and blocking reservations
        self.unit = unit
        self.swap = swap
        #: local weight name -> the leaf that backward rebinds to the fetched working copy
        self.weights = weights
        self._weight_ptrs = {w.untyped_storage().data_ptr(): name for name, w in weights.items()}
        #: storage address -> its entry
        self.entries: dict[int, Entry] = {}
        self.saved_bytes = 0

    # ------------------------------------------------------------- hooks
    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        local = self._weight_ptrs.get(ptr)
        if local is not None:
            return _WeightRef(local, tuple(t.size()), tuple(t.stride()), t.storage_offset())
        if ptr == 0:  # an empty tensor has no storage to swap
            return t
        entry = self.entries.get(ptr)
        if entry is None:
            entry = self.entries[ptr] = Entry(storage.nbytes())
            self.saved_bytes += entry.nbytes
            self.swap.save(self, entry, t)
        if self.swap.in_graph:
            # kept where it is: the graph holds the tensor itself (as without hooks); the entry only carries the
            # storage's charge, and a view rebuilt at unpack would cost Python time on every saved tensor
            return t
        return _SavedView(ptr, t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset())

    def unpack(self, h):
        if isinstance(h, torch.Tensor):
            return h
        if isinstance(h, _WeightRef):
            return self.weights[h.local].detach().as_strided(h.size, h.stride, h.offset)
        entry = self.entries[h.key]
        if entry.on_device is None:
            entry.on_device = self.swap.load(self, entry)
        return entry.on_device.view(h.dtype).as_strided(h.size, h.stride, h.offset)

    # ------------------------------------------------------------ movement
    def seal(self) -> None:
        """The unit's forward is done: swap its saved storages out (host copy, or an SSD write)."""
        self.swap.seal(self)

    def prefetch(self) -> None:
        """Start bringing swapped activations back (called one unit ahead in backward)."""
        self.swap.prefetch(self)

    def free(self) -> None:
        """After the unit's backward: drop every entry and release what it was charged."""
        rt = self.runtime
        for entry in self.entries.values():
            entry.tensor = entry.on_device = None
            if entry.buffer is not None:   # back to the pool ([Note: host copies in the store's buffers])
                rt.store.pool.free(Tier.HOST, entry.buffer)
                entry.buffer = entry.ready = None
            if entry.record is not None:
                rt.store.delete(entry.record)
                entry.record = None
            rt.uncharge(entry)
        self.entries.clear()
        self.weights = {}


class Swap:
    """Where a unit's saved storages rest between its forward and its backward, and how they travel there and
    back: the runtime side of an activation spec's ``rests_in`` (terastack.plan.activation_specs). This base
    holds a swapped storage until :meth:`seal` (its memory cannot be reused for another saved tensor during this
    forward -- storages are told apart by address -- and its content is final when copied)."""

    #: the graph holds the saved tensor itself (nothing is swapped)
    in_graph: ClassVar[bool] = False

    def save(self, stash: ActivationStash, entry: Entry, t: torch.Tensor) -> None:
        entry.tensor = storage_bytes(t)

    def seal(self, stash: ActivationStash) -> None:
        pass

    def prefetch(self, stash: ActivationStash) -> None:
        pass

    def load(self, stash: ActivationStash, entry: Entry) -> torch.Tensor:
        """The entry's bytes where backward reads them."""
        return entry.tensor


class KeepOnDevice(Swap):
    in_graph = True

    def save(self, stash: ActivationStash, entry: Entry, t: torch.Tensor) -> None:
        # the graph keeps the tensor, so its storage (and address) stays taken until backward
        stash.runtime.charge(entry, Tier.DEVICE, entry.nbytes, what=f"activations kept by {stash.unit.path}")


class SwapToHost(Swap):
    """Host copies in the store's host-tier buffers ([Note: host copies in the store's buffers])."""

    def seal(self, stash: ActivationStash) -> None:
        rt = stash.runtime
        pool = rt.store.pool
        what = f"activations of {stash.unit.path} swapped to host"
        for entry in stash.entries.values():
            raw, entry.tensor = entry.tensor, None
            padded = padded_size(entry.nbytes)
            # reserved in the host ledger by the pool; without room, wait for writes in flight as a charge does
            entry.buffer = rt.with_room(lambda padded=padded: pool.alloc(Tier.HOST, padded, what=what), what)
            entry.tensor = entry.buffer[:entry.nbytes]
            if raw.device.type == "cpu":
                entry.tensor.copy_(raw)
            else:
                entry.ready = to_host(entry.tensor, raw)   # on the download stream; raw may be freed at once
                pool.fence(entry.buffer, entry.ready)

    def load(self, stash: ActivationStash, entry: Entry) -> torch.Tensor:
        device = stash.runtime.device
        if device.type == "cpu":
            return entry.tensor
        stream = torch.cuda.current_stream(device)
        if entry.ready is not None:
            stream.wait_event(entry.ready)   # the download has landed before the copy back reads the buffer
        out = entry.tensor.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        stash.runtime.store.pool.fence(entry.buffer, done)   # handed out again only after the copy back read it
        return out


class SwapToSsd(Swap):
    def seal(self, stash: ActivationStash) -> None:
        rt = stash.runtime
        rt.throttle_activation_writes()
        writes = []
        for entry in stash.entries.values():
            raw, entry.tensor = entry.tensor, None
            # charged to the device until written: the bytes stay in memory until then
            charge = rt.charge(entry, Tier.DEVICE, entry.nbytes,
                               what=f"activations of {stash.unit.path} on their way to the SSD")
            entry.record = records.activation(stash.unit.index, next(_names))
            # a device storage is staged to the SSD by the store on its download stream, after the forward's queued
            # kernels: no blocking copy on this thread ([Note: stream order of staged transfers] in terastack.io.cuda)
            entry.write = rt.store.put(entry.record, raw, home=Tier.SSD)
            rt.track_write(entry.write)
            entry.write.add_done_callback(lambda _f, e=entry, c=charge: rt.uncharge(e, c))
            writes.append(entry.write)
        if writes:
            rt.activation_writes_issued(writes)

    def prefetch(self, stash: ActivationStash) -> None:
        rt = stash.runtime
        for entry in stash.entries.values():
            if entry.tensor is None and entry.record is not None:
                try:
                    rt.store.prefetch(entry.record, Tier.DEVICE)
                except MemoryError:
                    return  # no room yet: load fetches it when backward gets here

    def load(self, stash: ActivationStash, entry: Entry) -> torch.Tensor:
        return stash.runtime.wait(stash.runtime.store.prefetch(entry.record, Tier.DEVICE),
                                  f"activations of {stash.unit.path} coming back from the SSD")
