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
"""
from __future__ import annotations

import threading

import torch

from terastack.io.buffers import aligned_empty
from terastack.tiers.budget import BudgetLedger
from terastack.tiers.record import Tier


class BufferPool:
    """Allocates, reuses and frees the padded working buffers of the tiers in ``budgets``.

    Every buffer handed out is reserved against its tier's :class:`BudgetLedger`; pooled (free, reusable)
    bytes are kept within what the budget leaves unreserved. Thread-safe; it never calls back into the store,
    so the store may call it while holding its own lock."""

    def __init__(self, budgets: dict[Tier, BudgetLedger], device: torch.device):
        self.budgets = budgets
        self.device = device
        self._lock = threading.Lock()
        self._free: dict[Tier, dict[int, list[torch.Tensor]]] = {tier: {} for tier in budgets}
        self._pooled = {tier: 0 for tier in budgets}
        self._moved: dict[int, Tier] = {}  # buffer address -> the tier that allocated it, for moved copies

    def alloc(self, tier: Tier, padded: int, *, what: str, zero: bool = False) -> torch.Tensor:
        """A ``padded``-byte buffer in ``tier``, reserved against its budget (raises BudgetError naming
        ``what`` when it does not fit)."""
        ledger = self.budgets[tier]
        ledger.reserve(padded, what=what)
        try:
            if tier is Tier.DEVICE and self.device.type == "cuda":
                raw = torch.empty(padded, dtype=torch.uint8, device=self.device)
                return raw.zero_() if zero else raw
            with self._lock:
                pool = self._free[tier].get(padded)
                if pool:
                    self._pooled[tier] -= padded
                    raw = pool.pop()
                    if not pool:
                        del self._free[tier][padded]
                    return raw.zero_() if zero else raw
                self._trim(tier, ledger.limit - ledger.used)
            return aligned_empty(padded, torch.uint8, as_tensor=True)
        except BaseException:
            ledger.release(padded)
            raise

    def free(self, tier: Tier, raw: torch.Tensor) -> None:
        """Release ``raw`` from ``tier``'s budget; a host-memory buffer is kept for reuse."""
        self.budgets[tier].release(raw.numel())
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
            pools[size].pop()
            self._pooled[tier] -= size
            if not pools[size]:
                del pools[size]
