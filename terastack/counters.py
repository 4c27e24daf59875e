"""Counters that several threads add to (a sampler thread, a gather thread, the training loop)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(slots=True)
class Counters:
    """A base for dataclasses of numeric counters: ``add(rows=3, ssd_bytes=4096)`` adds under one lock, so a
    snapshot taken under the same lock never sees half of an update."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)
