"""Byte budgets per tier. A budget is a contract: reserving past it raises
:class:`~terastack.errors.BudgetError` naming the tier and the shortfall, and the
peak is recorded so tests can assert it against a formula. On a GPU the device tier's buffers are
charged the caching allocator's size for them (terastack.allocator)."""
from __future__ import annotations

import threading

from terastack.errors import BudgetError


class BudgetLedger:
    def __init__(self, name: str, limit: int):
        if limit < 0:
            raise ValueError(f"{name} budget: must be >= 0, got {limit}")
        self.name = name
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, *, what: str = "") -> None:
        with self._lock:
            if self.used + nbytes > self.limit:
                raise BudgetError(self.name, needed=nbytes, available=self.limit - self.used, limit=self.limit,
                                  what=what)
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def release(self, nbytes: int) -> None:
        with self._lock:
            if nbytes > self.used:
                raise RuntimeError(f"{self.name} budget: releasing {nbytes} bytes but only {self.used} are reserved")
            self.used -= nbytes

    @property
    def free(self) -> int:
        return self.limit - self.used

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.used

    def snapshot(self) -> dict:
        with self._lock:
            return {"limit": self.limit, "used": self.used, "peak": self.peak}

    def __repr__(self) -> str:
        return f"BudgetLedger({self.name!r}, used={self.used}, limit={self.limit}, peak={self.peak})"
