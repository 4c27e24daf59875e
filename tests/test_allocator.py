"""The caching allocator's size for a request, as the device ledger charges it and the planner prices it."""
import pytest

from terastack.allocator import allocator_bytes, device_held_bytes, expandable_segments

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize("nbytes, expected", [
    (0, 0),
    (1, 512),                           # every block is a multiple of 512 bytes
    (512, 512),
    (513, 1024),
    (4 * KiB, 4 * KiB),
    (1 * MiB + 1, 1 * MiB + 512),       # a large-pool block carved from a shared 20 MiB segment: its block
    (10 * MiB - 512, 10 * MiB - 512),
    (10 * MiB, 10 * MiB),               # from 10 MiB on: a segment of its own, rounded up to 2 MiB
    (10 * MiB + 1, 12 * MiB),
    (11 * MiB, 12 * MiB),
    (64 * MiB, 64 * MiB),
    (1000 * MiB + 4 * KiB, 1002 * MiB),
])
def test_device_charge_follows_the_caching_allocator(nbytes, expected):
    assert allocator_bytes(nbytes) == expected


def test_expandable_segments_leave_only_the_block_rounding():
    assert allocator_bytes(11 * MiB, expandable=True) == 11 * MiB
    assert allocator_bytes(10 * MiB + 1, expandable=True) == 10 * MiB + 512
    with pytest.raises(ValueError, match="nbytes"):
        allocator_bytes(-1)


def test_expandable_segments_read_from_the_allocator_settings(monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert not expandable_segments()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128, expandable_segments:True")
    assert expandable_segments()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert not expandable_segments()
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:true")
    assert expandable_segments()


def test_a_device_record_is_its_padded_size_rounded_by_the_allocator_on_cuda(monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert device_held_bytes(1, cuda=False) == 4 * KiB              # the store's block, whatever the device
    assert device_held_bytes(1, cuda=True) == 4 * KiB
    assert device_held_bytes(10 * MiB + 1, cuda=False) == 10 * MiB + 4 * KiB
    assert device_held_bytes(10 * MiB + 1, cuda=True) == 12 * MiB   # its own segment, rounded up to 2 MiB
    assert device_held_bytes(10 * MiB + 1, cuda=True, expandable=True) == 10 * MiB + 4 * KiB
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # read from the settings by default
    assert device_held_bytes(10 * MiB + 1, cuda=True) == 10 * MiB + 4 * KiB
