"""Free space in one linear range: sorted, coalesced extents handed out first fit.

Both allocators over a linear range use it: the aligned arena's host memory (:class:`terastack.io.AlignedArena`)
and the store's data files (:class:`terastack.tiers.ExtentAllocator`). It knows nothing of alignment or locks:
the caller rounds sizes to its unit and holds its own lock around every call.
"""
from __future__ import annotations

import bisect


class FreeList:
    """Free extents ``(start, size)`` of a range, kept sorted by start and coalesced: no two free extents touch.

    ``take`` finds the lowest-addressed extent that fits (first fit keeps long-lived data low and the tail of a
    file free to grow); ``give`` returns an extent and merges it with the free neighbours it touches. Giving back
    space that is already free (a double release) is a ValueError, not a silently corrupted list.
    """

    __slots__ = ("_starts", "_sizes")

    def __init__(self, start: int = 0, size: int = 0):
        self._starts: list[int] = []       # sorted starts of the free extents
        self._sizes: dict[int, int] = {}   # start -> size
        if size > 0:
            self.give(start, size)

    def take(self, size: int) -> int | None:
        """The start of ``size`` bytes taken from the first free extent that holds them, or None if none does."""
        if size <= 0:
            raise ValueError(f"size: must be > 0, got {size}")
        for i, start in enumerate(self._starts):
            extent = self._sizes[start]
            if extent >= size:
                del self._starts[i]
                del self._sizes[start]
                if extent > size:
                    # the rest keeps its place in the order: it starts after `start` and before the next extent
                    self._starts.insert(i, start + size)
                    self._sizes[start + size] = extent - size
                return start
        return None

    def give(self, start: int, size: int) -> None:
        """Return ``[start, start + size)`` to the free space, merged with the free extents it touches."""
        if size <= 0 or start < 0:
            raise ValueError(f"extent: start must be >= 0 and size > 0, got start={start}, size={size}")
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and self._starts[i] < start + size:
            raise ValueError(f"extent [{start}, {start + size}) overlaps the free extent at {self._starts[i]}")
        if i > 0 and self._starts[i - 1] + self._sizes[self._starts[i - 1]] > start:
            prev = self._starts[i - 1]
            raise ValueError(f"extent [{start}, {start + size}) overlaps the free extent "
                             f"[{prev}, {prev + self._sizes[prev]})")
        # coalesce with the following extent
        if i < len(self._starts) and self._starts[i] == start + size:
            size += self._sizes.pop(self._starts[i])
            del self._starts[i]
        # coalesce with the preceding extent
        if i > 0:
            prev = self._starts[i - 1]
            if prev + self._sizes[prev] == start:
                self._sizes[prev] += size
                return
        self._starts.insert(i, start)
        self._sizes[start] = size

    def clear(self) -> None:
        self._starts.clear()
        self._sizes.clear()

    def largest(self) -> int:
        """Size of the largest free extent (0 when nothing is free)."""
        return max(self._sizes.values(), default=0)

    def total(self) -> int:
        """Free bytes in all."""
        return sum(self._sizes.values())

    def extents(self) -> list[tuple[int, int]]:
        """The free extents ``(start, size)`` in address order."""
        return [(s, self._sizes[s]) for s in self._starts]

    def __len__(self) -> int:
        return len(self._starts)
