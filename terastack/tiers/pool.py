"""Working buffers of the host and device tiers, reserved against each tier's budget.

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
without a copy (see :meth:`BufferPool.move`); its buffer goes back to the pool
of the tier that allocated it, so each tier's pool keeps serving its own sizes.

[Note: pinned host tier]
With the device tier on a GPU, host-tier buffers are page-locked
(``pinned_host_empty`` in terastack.io.cuda), so copies between the tiers run
asynchronously at pinned bandwidth, as the planner prices them. A buffer's
pinned bytes are its own bytes, reserved once in the host ledger. A host
buffer an asynchronous copy still reads or writes carries that copy's event
(a *fence*, :meth:`BufferPool.fence`): it is waited on before the buffer is
handed out again, dropped, or given to a CPU reader (:meth:`BufferPool.settle`).
Device-tier buffers are charged the caching allocator's size for them
([Note: the device ledger and the caching allocator] in terastack.allocator).
"""
from __future__ import annotations

import threading
import warnings

import torch

from terastack.allocator import allocator_bytes, expandable_segments
from terastack.io.buffers import aligned_empty
from terastack.io.cuda import pinned_host_empty, to_device, to_host
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.record import Tier


class BufferPool:
    """Allocates, reuses and frees the padded working buffers of the tiers in ``budgets``.

    Every buffer handed out is reserved against its tier's :class:`BudgetLedger`; pooled (free, reusable)
    bytes are kept within what the budget leaves unreserved. Thread-safe; it never calls back into the store,
    so the store may call it while holding its own lock."""

    def __init__(self, budgets: dict[Tier, BudgetLedger], device: torch.device, *, pin: bool | None = None):
        """``pin``: host-tier buffers page-locked ([Note: pinned host tier]); by default when ``device`` is a GPU."""
        self.budgets = budgets
        self.device = device
        self.pin = device.type == "cuda" if pin is None else pin
        self._on_gpu = device.type == "cuda"
        self._expandable = self._on_gpu and expandable_segments()
        self._fences: dict[int, object] = {}  # host buffer address -> the event of a copy still using it
        self._lock = threading.Lock()
        self._free: dict[Tier, dict[int, list[torch.Tensor]]] = {tier: {} for tier in budgets}
        self._pooled = {tier: 0 for tier in budgets}
        self._moved: dict[int, Tier] = {}  # buffer address -> the tier that allocated it, for moved copies

    def alloc(self, tier: Tier, padded: int, *, what: str, zero: bool = False) -> torch.Tensor:
        """A ``padded``-byte buffer in ``tier``, reserved against its budget (raises BudgetError naming
        ``what`` when it does not fit)."""
        ledger = self.budgets[tier]
        on_gpu = tier is Tier.DEVICE and self._on_gpu
        charge = self.charge(tier, padded)
        ledger.reserve(charge, what=what)
        try:
            if on_gpu:
                # on the calling thread's current stream (a caller on a side stream allocates inside it)
                raw = torch.empty(padded, dtype=torch.uint8, device=self.device)
                return raw.zero_() if zero else raw
            with self._lock:
                pool = self._free[tier].get(padded)
                if pool:
                    self._pooled[tier] -= padded
                    raw = pool.pop()
                    if not pool:
                        del self._free[tier][padded]
                else:
                    raw = None
                    self._trim(tier, ledger.limit - ledger.used)
            if raw is not None:
                self.settle(raw)  # a copy may still use it (outside the lock: this waits for the GPU)
                return raw.zero_() if zero else raw
            if tier is Tier.HOST and self.pin:
                try:
                    return pinned_host_empty(padded)  # [Note: pinned host tier]; zero-filled, like aligned_empty
                except RuntimeError as exc:
                    # pageable memory still moves correctly (copies from or into it are synchronous), only slower
                    self.pin = False
                    warnings.warn(f"host tier not page-locked from now on: {exc}", RuntimeWarning, stacklevel=2)
            return aligned_empty(padded, torch.uint8, as_tensor=True)
        except BaseException:
            ledger.release(charge)
            raise

    def charge(self, tier: Tier, padded: int) -> int:
        """What a ``padded``-byte buffer of ``tier`` costs its ledger: on a GPU's device tier, the caching
        allocator's size for it; elsewhere its bytes."""
        if tier is Tier.DEVICE and self._on_gpu:
            return allocator_bytes(padded, expandable=self._expandable)
        return padded

    def upload(self, src: torch.Tensor, padded: int, *, what: str) -> torch.Tensor:
        """A new device-tier copy of host buffer ``src``; the calling thread's current stream waits for it, and
        ``src`` is fenced by the upload ([Note: copies between the host and device tiers] in terastack.io.cuda)."""
        raw, done = to_device(src, lambda: self.alloc(Tier.DEVICE, padded, what=what), self.device)
        self.fence(src, done)  # a CPU writer of src, or its next owner, waits for the upload
        return raw

    def download(self, src: torch.Tensor, padded: int, *, what: str):
        """A new host-tier copy of device buffer ``src`` and the event to wait on before reading it (``src`` may
        be freed at once: the copy's stream is recorded on it)."""
        raw = self.alloc(Tier.HOST, padded, what=what)
        try:
            return raw, to_host(raw, src)
        except BaseException:
            self.free(Tier.HOST, raw)
            raise

    def fence(self, raw: torch.Tensor, event) -> None:
        """Host buffer ``raw`` is used by an asynchronous copy until ``event`` (``synchronize()``) has fired."""
        with self._lock:
            self._fences[raw.data_ptr()] = event

    def settle(self, raw: torch.Tensor | None) -> None:
        """Wait for the copy still using host buffer ``raw``, if any ([Note: pinned host tier]; any other buffer,
        or None: nothing to wait for)."""
        if not self._fences or raw is None:
            return  # the common case, and always without an accelerator
        with self._lock:
            event = self._fences.pop(raw.data_ptr(), None)
        if event is not None:
            event.synchronize()

    def settle_all(self) -> None:
        """Wait for every copy still using a host buffer."""
        with self._lock:
            events, self._fences = list(self._fences.values()), {}
        for event in events:
            event.synchronize()

    def free(self, tier: Tier, raw: torch.Tensor, *, after=None) -> None:
        """Release ``raw`` from ``tier``'s budget; a host-memory buffer is kept for reuse. ``after``: the event of
        an asynchronous copy still reading or writing ``raw`` ([Note: pinned host tier])."""
        self.budgets[tier].release(self.charge(tier, raw.numel()))
        if after is not None:
            self.fence(raw, after)
        if raw.device.type == "cpu":
            with self._lock:
                # back to the pool of the tier that allocated it (it may have moved, see move())
                home = self._moved.pop(raw.data_ptr(), tier)
                self._free[home].setdefault(raw.numel(), []).append(raw)
                self._pooled[home] += raw.numel()
                self._trim(home, self.budgets[home].limit - self.budgets[home].used)

    def move(self, raw: torch.Tensor, src: Tier, dst: Tier, *, what: str) -> None:
        """Account host-memory buffer ``raw`` to ``dst`` instead of ``src``, without a copy
        ([Note: tiers without an accelerator] in terastack.tiers.store)."""
        self.budgets[dst].reserve(raw.numel(), what=what)
        self.budgets[src].release(raw.numel())
        with self._lock:
            self._moved.setdefault(raw.data_ptr(), src)

    def pooled(self, tier: Tier) -> int:
        """Bytes of free buffers kept for reuse in ``tier``."""
        with self._lock:
            return self._pooled[tier]

    def trim(self) -> int:
        """Return every pooled buffer to the OS; the bytes released."""
        with self._lock:
            released = sum(self._pooled.values())
            for tier in self._free:
                self._trim(tier, 0)
            return released

    def _trim(self, tier: Tier, room: int) -> None:
        """Drop pooled buffers of ``tier`` until at most ``room`` bytes stay pooled (lock held)."""
        pools = self._free[tier]
        while self._pooled[tier] > room and pools:
            size = max(pools)
            dropped = pools[size].pop()
            event = self._fences.pop(dropped.data_ptr(), None) if self._fences else None
            if event is not None:
                event.synchronize()  # its pages may go back to the system (unregistered, unmapped) next
            self._pooled[tier] -= size
            if not pools[size]:
                del pools[size]
