"""Byte budgets per tier. A budget is a contract: reserving past it raises
:class:`~terastack.errors.BudgetError` naming the tier and the shortfall, and the
peak is recorded so tests can assert it against a formula."""
from __future__ import annotations

import os
import threading

from terastack.errors import BudgetError

# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every block is a multiple of 512 bytes;
# requests up to 1 MiB share 2 MiB segments, those under 10 MiB share 20 MiB segments, and larger ones get a
# segment of their own rounded up to 2 MiB ([Note: the device ledger and the caching allocator])
MIN_BLOCK = 512
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def allocator_bytes(nbytes: int, *, expandable: bool = False) -> int:
    """The device memory PyTorch's caching allocator takes for a request of ``nbytes``.

    [Note: the device ledger and the caching allocator]
    A device-tier buffer holds more than its bytes: the allocator rounds every
    block up to a multiple of 512 bytes, and without expandable segments a
    request of 10 MiB or more gets a segment of its own, rounded up to 2 MiB
    (the rest of it can only serve requests that fit in under 2 MiB). Smaller
    requests are carved from shared 2 MiB / 20 MiB segments, whose leftovers
    serve other requests: they are charged their block. With expandable
    segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, what
    terastack asks for unless told otherwise: ``prefer_expandable_segments`` in
    terastack.io.cuda) one growing segment per stream maps 2 MiB pages, so only
    the 512-byte block rounding remains. The device ledger charges this size, so
    its peak bounds what the allocator holds for the store's buffers (not the
    fragmentation between segments, which expandable segments keep small)."""
    if nbytes < 0:
        raise ValueError(f"nbytes: must be >= 0, got {nbytes}")
    if nbytes == 0:
        return 0
    block = -(-nbytes // MIN_BLOCK) * MIN_BLOCK
    if expandable or block < MIN_LARGE_ALLOC:
        return block
    return -(-block // ROUND_LARGE) * ROUND_LARGE


def expandable_segments() -> bool:
    """Whether the allocator settings in the environment ask for expandable segments."""
    conf = ",".join(os.environ.get(v, "") for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))
    settings = dict(part.split(":", 1) for part in conf.replace(" ", "").split(",") if ":" in part)
    return settings.get("expandable_segments", "").lower() == "true"


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
