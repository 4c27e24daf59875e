"""Sizes every layer agrees on: the O_DIRECT block, the huge page, and the store's padding rule.

One module so that the planner's arithmetic and the store's layout cannot drift apart: the
planner sizes a record exactly as the store will hold it (:func:`padded_size`). It imports
nothing from terastack, so any layer (``plan`` included) may use it.
"""
from __future__ import annotations

#: O_DIRECT alignment for addresses, offsets and lengths (covers 512 B and 4 KiB sector devices);
#: also the block the store rounds every record up to, and the unit of an SSD's random-read IOPS.
DIRECT_ALIGN = 4096
BLOCK = DIRECT_ALIGN
#: from this size up, transfer buffers ask for transparent huge pages (see terastack.io.buffers).
HUGE_PAGE = 2 << 20
#: sequential transfers are issued in requests of this size (benchmarks, probes, streaming copies).
SEQ_BLOCK = 1 << 20


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_size(nbytes: int) -> int:
    """Bytes a record of ``nbytes`` occupies in the store (any tier, and on disk): whole blocks, at least one."""
    return max(BLOCK, round_up(nbytes, BLOCK))
