import numpy as np
import pytest
import torch

from terastack import io


def test_arena_buffers_are_page_aligned_and_budgeted():
    arena = io.AlignedArena(64 * 1024, name="pinned")
    a = arena.alloc(100)
    b = arena.alloc(5000)
    assert a.address % 4096 == 0 and b.address % 4096 == 0
    assert (a.capacity, b.capacity) == (4096, 8192)
    assert arena.used == 12288 and arena.peak == 12288
    with pytest.raises(io.BudgetError) as info:
        arena.alloc(60 * 1024)
    e = info.value
    assert e.budget == "pinned" and e.needed == 61440 and e.shortfall == 61440 - e.available
    assert "pinned budget exceeded" in str(e) and "short by" in str(e)
    a.release()
    b.release()
    assert arena.used == 0
    whole = arena.alloc(64 * 1024)  # freed extents coalesced back into one
    assert whole.offset == 0
    whole.release()


def test_arena_views_share_memory():
    arena = io.AlignedArena(1 << 16)
    with arena.alloc(4096) as buf:
        buf.numpy(np.float32)[:] = 2.0
        t = buf.tensor(torch.float32, (32, 32))
        assert t.shape == (32, 32) and float(t.sum()) == 2.0 * 1024
        with pytest.raises(ValueError):
            buf.numpy(np.float32, (2000,))
    assert arena.used == 0


def test_aligned_empty():
    a = io.aligned_empty((3, 5), np.float64)
    assert a.shape == (3, 5) and a.ctypes.data % 4096 == 0 and not a.any()
    t = io.aligned_empty(7, torch.int16, as_tensor=True)
    assert t.dtype == torch.int16 and t.data_ptr() % 4096 == 0


def test_view_buffer_kinds():
    v = io.view_buffer(torch.zeros(10, dtype=torch.float64), writable=True)
    assert v.nbytes == 80
    with pytest.raises(ValueError, match="read-only"):
        io.view_buffer(np.frombuffer(b"abcd", np.uint8), writable=True)
    assert io.view_buffer(memoryview(bytearray(12)).cast("I"), writable=True).nbytes == 12
