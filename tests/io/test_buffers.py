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


def _vm_flags(address: int) -> list[str]:
    from terastack.io.buffers import mapping_fields

    flags = mapping_fields(address).get("VmFlags")
    assert flags is not None, f"no mapping holds {address:#x}"
    return flags.split()


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this platform")
def test_large_buffers_ask_for_huge_pages_small_ones_do_not():
    from terastack.io.buffers import HUGE_PAGE, huge_page_bytes

    large = io.aligned_empty(2 * HUGE_PAGE)
    small = io.aligned_empty(64 * 1024)
    arena = io.AlignedArena(HUGE_PAGE)
    tensor = io.aligned_empty(HUGE_PAGE // 4, torch.float32, as_tensor=True)
    # "hg": the mapping carries MADV_HUGEPAGE (the kernel's smaps flag), whatever memory it then finds
    assert "hg" in _vm_flags(large.ctypes.data)
    assert "hg" in _vm_flags(arena.address)
    assert "hg" in _vm_flags(tensor.data_ptr())
    assert "hg" not in _vm_flags(small.ctypes.data)
    from terastack.io.buffers import anonymous_map

    assert "nh" in _vm_flags(np.frombuffer(anonymous_map(HUGE_PAGE, huge_pages=False), np.uint8).ctypes.data)
    large[:] = 1
    backed = huge_page_bytes(large)
    assert 0 <= backed <= large.nbytes and backed % HUGE_PAGE == 0
    assert huge_page_bytes(tensor) % HUGE_PAGE == 0 and huge_page_bytes(small) == 0
