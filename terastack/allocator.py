"""The device memory PyTorch's CUDA caching allocator takes for a request, read in one place.

The store's device ledger (terastack.tiers) charges it for every device-tier buffer on a GPU, and the
planner (terastack.plan) prices device-resident records with it, so that plan and ledger cannot disagree.
It imports nothing from terastack but the store's padding rule, so any layer (``plan`` included) may use it.
"""
from __future__ import annotations

import os

from terastack.constants import padded_size

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
    fragmentation between segments, which expandable segments keep small); the
    planner prices a device-resident record the same way (:func:`device_held_bytes`)."""
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


def device_held_bytes(nbytes: int, *, cuda: bool, expandable: bool | None = None) -> int:
    """Device memory a store record of ``nbytes`` takes in the device tier: its padded size
    (:func:`~terastack.constants.padded_size`), and on a CUDA device the caching allocator's size for that
    (``expandable``: None reads the allocator settings from the environment, as the store's pool does)."""
    held = padded_size(nbytes)
    if not cuda:
        return held  # without an accelerator the device tier is host memory: a buffer is its bytes
    return allocator_bytes(held, expandable=expandable_segments() if expandable is None else expandable)
