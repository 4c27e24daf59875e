"""The one coalescing free list (terastack.io.free_list) against a bitmap of free units, and both its users."""
import random

import pytest

from terastack.io.buffers import PAGE, AlignedArena
from terastack.io.free_list import FreeList
from terastack.tiers.extents import Extent, ExtentAllocator


def runs(free: list[bool]) -> list[tuple[int, int]]:
    """Maximal runs of free units (start, length): what a coalesced free list must hold."""
    out, start = [], None
    for i, f in enumerate(free + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i - start))
            start = None
    return out


def test_matches_a_bitmap_through_random_takes_and_gives():
    rng = random.Random(0)
    size = 200
    fl, free = FreeList(0, size), [True] * size
    held: list[tuple[int, int]] = []
    for _ in range(3000):
        if held and rng.random() < 0.45:
            start, n = held.pop(rng.randrange(len(held)))
            fl.give(start, n)
            free[start:start + n] = [True] * n
        else:
            n = rng.randint(1, 12)
            fits = [s for s, length in runs(free) if length >= n]
            start = fl.take(n)
            assert start == (fits[0] if fits else None)  # first fit: the lowest extent that holds it
            if start is not None:
                assert all(free[start:start + n])
                free[start:start + n] = [False] * n
                held.append((start, n))
        assert fl.extents() == runs(free)  # sorted and coalesced: no two free extents touch
        assert fl.total() == sum(free)
        assert fl.largest() == max((length for _, length in runs(free)), default=0)


def test_give_coalesces_with_both_neighbours():
    fl = FreeList()
    fl.give(0, 4)
    fl.give(8, 4)
    assert fl.extents() == [(0, 4), (8, 4)]
    fl.give(4, 4)
    assert fl.extents() == [(0, 12)] and len(fl) == 1


def test_double_give_and_bad_extents_are_refused():
    fl = FreeList(0, 16)
    assert fl.take(8) == 0
    with pytest.raises(ValueError, match="overlaps"):
        fl.give(8, 4)  # still free
    with pytest.raises(ValueError, match="overlaps"):
        fl.give(4, 8)  # its tail is free
    for start, size in ((0, 0), (-1, 4)):
        with pytest.raises(ValueError, match="extent"):
            fl.give(start, size)
    with pytest.raises(ValueError, match="size"):
        fl.take(0)
    assert fl.extents() == [(8, 8)]  # a refused give changes nothing


def test_arena_and_extent_allocator_share_it():
    with AlignedArena(4 * PAGE, name="host") as arena:
        a, b, c = (arena.alloc(PAGE) for _ in range(3))
        a.release()
        c.release()
        assert arena._free.extents() == [(0, PAGE), (2 * PAGE, 2 * PAGE)]
        b.release()
        assert arena._free.extents() == [(0, 4 * PAGE)] and arena.used == 0
    alloc = ExtentAllocator(dir=1)
    e1, e2 = alloc.alloc(1), alloc.alloc(5000)
    assert (e1, e2) == (Extent(0, 4096, 1), Extent(4096, 8192, 1))
    alloc.free(e1)
    with pytest.raises(ValueError, match="overlaps"):
        alloc.free(e1)  # a double free is an error, not two owners of one extent later
    assert alloc.alloc(4096) == Extent(0, 4096, 1)
    alloc.rebuild_free_list([Extent(4096, 4096, 1)])
    assert alloc._free.extents() == [(0, 4096), (8192, 4096)]
