"""Byte budgets per tier. A budget is a contract: reserving past it raises
:class:`~terastack.errors.BudgetError` naming the tier and the shortfall, and the
peak is recorded so tests can assert it against a formula."""
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


def staging_cap(largest_record: int, host_budget: int, *, in_flight: int = 2, share: float = 0.125) -> int:
    """The pinned staging cap of a store whose largest record is ``largest_record`` bytes, within ``host_budget``.

    Staging goes chunk by chunk ([Note: pinned staging] in terastack.io.cuda), so any cap of one chunk or more
    moves any record; the cap sets how many bytes are in flight at once. It is enough for ``in_flight`` of the
    largest records, at most ``share`` of the host budget (pinned pages are host memory and counted in its
    ledger) and at most 1 GiB, and at least two 4 KiB chunks; a power of two, like the chunks it is cut into."""
    if largest_record < 0 or host_budget < 0:
        raise ValueError(f"largest_record, host_budget: must be >= 0; got {largest_record}, {host_budget}")
    want = min(in_flight * largest_record, int(host_budget * share), 1 << 30)
    want = max(want, 8192)
    return 1 << (int(want).bit_length() - 1)
