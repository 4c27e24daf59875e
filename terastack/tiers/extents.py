"""Space on the store's data files: 4 KiB-aligned extents, first fit, coalesced on free.

One allocator per data file (one per directory of the store); its extents carry that
directory's index, so two extents at the same offset of different files never compare equal."""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

from terastack.constants import padded_size


@dataclass(frozen=True, slots=True)
class Extent:
    offset: int
    capacity: int  # bytes reserved on disk, a multiple of DIRECT_ALIGN
    dir: int = 0   # index of the store directory (data file) holding it


class ExtentAllocator:
    def __init__(self, end: int = 0, *, dir: int = 0):  # noqa: A002 - the Extent field it fills
        self.dir = dir
        self.end = end  # file offset past the last extent ever handed out
        self._free_starts: list[int] = []
        self._free_sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> Extent:
        size = padded_size(nbytes)
        with self._lock:
            for start in self._free_starts:
                extent = self._free_sizes[start]
                if extent >= size:
                    i = bisect.bisect_left(self._free_starts, start)
                    del self._free_starts[i]
                    del self._free_sizes[start]
                    if extent > size:
                        bisect.insort(self._free_starts, start + size)
                        self._free_sizes[start + size] = extent - size
                    return Extent(start, size, self.dir)
            start = self.end
            self.end += size
            return Extent(start, size, self.dir)

    def reserve(self, extent: Extent) -> None:
        """Mark an extent read from a manifest as used (stores reopened from disk)."""
        with self._lock:
            self.end = max(self.end, extent.offset + extent.capacity)

    def free(self, extent: Extent) -> None:
        start, size = extent.offset, extent.capacity
        with self._lock:
            i = bisect.bisect_left(self._free_starts, start)
            if i < len(self._free_starts) and self._free_starts[i] == start + size:
                size += self._free_sizes.pop(self._free_starts[i])
                del self._free_starts[i]
            if i > 0:
                prev = self._free_starts[i - 1]
                if prev + self._free_sizes[prev] == start:
                    self._free_sizes[prev] += size
                    return
            self._free_starts.insert(i, start)
            self._free_sizes[start] = size

    def rebuild_free_list(self, used: list[Extent]) -> None:
        """After reopening: every gap between used extents below ``end`` is free."""
        with self._lock:
            self._free_starts.clear()
            self._free_sizes.clear()
            cursor = 0
            for ext in sorted(used, key=lambda e: e.offset):
                if ext.offset > cursor:
                    self._free_starts.append(cursor)
                    self._free_sizes[cursor] = ext.offset - cursor
                cursor = max(cursor, ext.offset + ext.capacity)
            self.end = max(self.end, cursor)
            if self.end > cursor:
                self._free_starts.append(cursor)
                self._free_sizes[cursor] = self.end - cursor
