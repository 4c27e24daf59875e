"""Saved activations of one unit: kept on the device, swapped to host memory, or swapped to the SSD.

A unit's forward runs under ``torch.autograd.graph.saved_tensors_hooks``.
Every tensor autograd saves passes through :meth:`ActivationStash.pack`:

* a view of one of the unit's weights is saved as a *reference* (name, size,
  stride, offset): the weight's working copy is released after forward and
  fetched again for backward, so the graph never pins it;
* anything else is an activation. It is saved by *storage* (all views of one
  buffer, such as q, k and v split from one projection, share one entry) and,
  by policy, kept, copied to host memory, or written to the SSD through the
  store; backward gets it back as a view with the original size and strides.

Byte accounting: kept activations and activations on their way to or from the
SSD are charged to the device ledger, host copies to the host ledger, so the
budgets cover them (see the planner's memory model).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

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


class _Entry:
    """One saved storage: its bytes in some tier, and what they are charged to."""

    __slots__ = ("nbytes", "tensor", "on_device", "record", "write", "charged")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.tensor: torch.Tensor | None = None     # kept / host copy (uint8 over the storage)
        self.on_device: torch.Tensor | None = None  # brought back for backward (host copy on an accelerator, SSD)
        self.record: str | None = None              # store record (SSD policy)
        self.write: Future | None = None
        self.charged: list[tuple] = []               # (ledger, nbytes) to release when freed


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of ``t``."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


_names = itertools.count()


class ActivationStash:
    """Saved tensors of one unit forward under one policy ("keep", "host" or "ssd")."""

    def __init__(self, runtime, unit, policy: str, weights: dict[str, torch.Tensor]):
        self.runtime = runtime                      # gives store, ledgers, device and blocking reservations
        self.unit = unit
        self.policy = policy
        #: local weight name -> the leaf that backward rebinds to the fetched working copy
        self.weights = weights
        self._weight_ptrs = {w.untyped_storage().data_ptr(): name for name, w in weights.items()}
        self._entries: dict[int, _Entry] = {}
        self.saved_bytes = 0
        self._kept_what = f"activations kept by {unit.path}"

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
        entry = self._entries.get(ptr)
        if entry is None:
            entry = self._entries[ptr] = self._save(t, storage.nbytes())
        if self.policy == "keep":
            # kept where it is: the graph holds the tensor itself (as without hooks); the entry only carries the
            # storage's charge, and a view rebuilt at unpack would cost Python time on every saved tensor
            return t
        return _SavedView(ptr, t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset())

    def unpack(self, h):
        if isinstance(h, torch.Tensor):
            return h
        if isinstance(h, _WeightRef):
            return self.weights[h.local].detach().as_strided(h.size, h.stride, h.offset)
        raw = self._load(self._entries[h.key])
        return raw.view(h.dtype).as_strided(h.size, h.stride, h.offset)

    # ----------------------------------------------------------- policies
    def _save(self, t: torch.Tensor, nbytes: int) -> _Entry:
        entry = _Entry(nbytes)
        self.saved_bytes += nbytes
        if self.policy == "keep":
            # the graph keeps the tensor, so its storage (and address) stays taken until backward
            self.runtime.charge(entry, Tier.DEVICE, nbytes, what=self._kept_what)
            return entry
        if self.policy not in ("host", "ssd"):
            raise ValueError(f"activation policy {self.policy!r} of {self.unit.path}")
        # Swapped storages stay referenced until seal(): their memory cannot be reused for another saved tensor
        # during this forward (storages are told apart by address), and their content is final when copied.
        entry.tensor = storage_bytes(t)
        return entry

    def seal(self) -> None:
        """The unit's forward is done: swap its saved storages out (host copy, or an SSD write)."""
        if self.policy == "keep":
            return
        rt = self.runtime
        if self.policy == "ssd":
            rt.throttle_activation_writes()
        writes = []
        for entry in self._entries.values():
            raw, entry.tensor = entry.tensor, None
            if self.policy == "host":
                rt.charge(entry, Tier.HOST, entry.nbytes, what=f"activations of {self.unit.path} swapped to host")
                entry.tensor = rt.host_copy(raw)
                continue
            # charged to the device until written: the bytes stay in memory until then
            charge = rt.charge(entry, Tier.DEVICE, entry.nbytes,
                               what=f"activations of {self.unit.path} on their way to the SSD")
            entry.record = records.activation(self.unit.index, next(_names))
            entry.write = rt.store.put(entry.record, raw.cpu() if raw.device.type != "cpu" else raw, home=Tier.SSD)
            rt.track_write(entry.write)
            entry.write.add_done_callback(lambda _f, e=entry, c=charge: rt.uncharge(e, c))
            writes.append(entry.write)
        if writes:
            rt.activation_writes_issued(writes)

    def prefetch(self) -> None:
        """Start bringing SSD-swapped activations back to the device (called one unit ahead in backward)."""
        if self.policy != "ssd":
            return
        rt = self.runtime
        for entry in self._entries.values():
            if entry.tensor is None and entry.record is not None:
                try:
                    rt.store.prefetch(entry.record, Tier.DEVICE)
                except MemoryError:
                    return  # no room yet: _load fetches it when backward gets here

    def _load(self, entry: _Entry) -> torch.Tensor:
        if entry.on_device is not None:
            return entry.on_device
        rt = self.runtime
        if entry.record is not None:
            entry.on_device = rt.wait(rt.store.prefetch(entry.record, Tier.DEVICE),
                                      f"activations of {self.unit.path} coming back from the SSD")
        elif self.policy == "host" and rt.device.type != "cpu":
            entry.on_device = entry.tensor.to(rt.device, non_blocking=True)
        else:
            entry.on_device = entry.tensor
        return entry.on_device

    def free(self) -> None:
        """After the unit's backward: drop every entry and release what it was charged."""
        rt = self.runtime
        for entry in self._entries.values():
            entry.tensor = entry.on_device = None
            if entry.record is not None:
                rt.store.delete(entry.record)
                entry.record = None
            rt.uncharge(entry)
        self._entries.clear()
        self.weights = {}
