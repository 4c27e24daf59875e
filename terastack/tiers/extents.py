"""Space on the store's data files: 4 KiB-aligned extents, first fit, coalesced on free (:mod:`terastack.io.free_list`).

One allocator per data file (one per directory of the store); its extents carry that
directory's index, so two extents at the same offset of different files never compare equal."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from terastack.constants import padded_size
from terastack.io.free_list import FreeList


@dataclass(frozen=True, slots=True)
class Extent:
    offset: int
    capacity: int  # bytes reserved on disk, a multiple of DIRECT_ALIGN
    dir: int = 0   # index of the store directory (data file) holding it


class ExtentAllocator:
    def __init__(self, end: int = 0, *, dir: int = 0):  # noqa: A002 - the Extent field it fills
        self.dir = dir
        self.end = end  # file offset past the last extent ever handed out
        self._free = FreeList()  # below `end`; space past `end` is never in it
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> Extent:
        size = padded_size(nbytes)
        with self._lock:
            start = self._free.take(size)
            if start is not None:
                return Extent(start, size, self.dir)
            start = self.end
            self.end += size
            return Extent(start, size, self.dir)

    def reserve(self, extent: Extent) -> None:
        """Mark an extent read from a manifest as used (stores reopened from disk)."""
        with self._lock:
            self.end = max(self.end, extent.offset + extent.capacity)

    def free(self, extent: Extent) -> None:
        with self._lock:
            self._free.give(extent.offset, extent.capacity)

    def rebuild_free_list(self, used: list[Extent]) -> None:
        """After reopening: every gap between used extents below ``end`` is free."""
        with self._lock:
            self._free.clear()
            cursor = 0
            for ext in sorted(used, key=lambda e: e.offset):
                if ext.offset > cursor:
                    self._free.give(cursor, ext.offset - cursor)
                cursor = max(cursor, ext.offset + ext.capacity)
            self.end = max(self.end, cursor)
            if self.end > cursor:
                self._free.give(cursor, self.end - cursor)
