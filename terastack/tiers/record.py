"""One record per tensor: its tiers, its state, and the snapshot callers may see.

[Note: record states]
A record moves through four states; each transition happens under the store's
lock, and a record has a future exactly while it is INFLIGHT_*:

    ON_SSD --prefetch--> INFLIGHT_IN --read done--> RESIDENT --writeback/evict (dirty)--> INFLIGHT_OUT
      ^                    | read failed                |  ^                                   |
      +--------------------+                            |  +------------- write done -----------+
      +---------- evict of a clean copy / evict once written ----------------------------------+

``tier`` is where the working copy lives (``Tier.SSD`` while ON_SSD); ``home``
is where the tensor rests. A host- or device-home tensor is RESIDENT from
``put``/``create`` on; its SSD copy is written at ``commit``. An SSD-home
``put`` starts INFLIGHT_OUT and settles ON_SSD.

The live :class:`TensorRecord` (buffers, extent, future bookkeeping) never
leaves the store; :class:`RecordInfo` is the frozen snapshot it hands out.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from terastack.constants import padded_size
from terastack.io.futures import Future
from terastack.tier import Tier
from terastack.tiers.extents import Extent


class State(str, enum.Enum):
    ON_SSD = "on_ssd"              # only the SSD copy exists
    INFLIGHT_IN = "inflight_in"    # a working copy is being read into `tier`
    RESIDENT = "resident"          # a working copy lives in `tier`
    INFLIGHT_OUT = "inflight_out"  # the working copy (or a put) is being written to SSD


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """What callers may know of a record: a snapshot taken under the store's lock. The live
    :class:`TensorRecord` (buffers, extent, the future's bookkeeping) never leaves the store."""
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    padded: int
    home: Tier
    state: State
    tier: Tier
    on_disk: bool
    dirty: bool
    future: Future | None  # the transfer in flight, if any (futures are safe to share)


class Fetch(NamedTuple):
    """Result of :meth:`TieredStore.fetch`: the future of the tensor in the asked tier (None when a transfer
    was in flight and the caller asked not to wait behind it) and the bytes this call set moving."""
    future: Future | None
    moved_bytes: int


@dataclass(eq=False, slots=True)
class TensorRecord:
    """The live record of one tensor. Mutated only under the owning store's lock; see [Note: record states]."""
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    home: Tier
    state: State
    tier: Tier                          # tier of the working copy (SSD while ON_SSD)
    buffer: torch.Tensor | None = None  # padded uint8 working copy in `tier`
    home_buffer: torch.Tensor | None = None  # resting copy of a HOST-home tensor
    extent: Extent | None = None        # where its bytes are on SSD (which directory, offset, capacity)
    on_disk: bool = False               # `extent` holds its current bytes
    dirty: bool = False                 # the working copy is newer than the SSD copy
    future: Future | None = None        # the transfer in flight, if any
    # the typed view of `buffer` last made, and the buffer it views: a step asks for the same resident tensors
    # over and over, and three tensor views per request were a measurable part of a step's Python cost
    _typed: torch.Tensor | None = field(default=None, init=False, repr=False)
    _typed_of: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def padded(self) -> int:
        return padded_size(self.nbytes)

    def view(self, raw: torch.Tensor | None = None) -> torch.Tensor:
        if raw is None or raw is self.buffer:
            raw = self.buffer
            if self._typed_of is not raw:
                self._typed, self._typed_of = raw[: self.nbytes].view(self.dtype).view(self.shape), raw
            return self._typed
        return raw[: self.nbytes].view(self.dtype).view(self.shape)

    def switch_buffer(self, raw: torch.Tensor | None, tier: Tier) -> None:
        """The working copy is now ``raw`` in ``tier`` (the old buffer is the caller's to free: no view of it is
        kept here)."""
        self.buffer, self.tier = raw, tier
        self._typed = self._typed_of = None

    def info(self) -> RecordInfo:
        """The frozen snapshot of this record (call under the store's lock)."""
        return RecordInfo(name=self.name, shape=self.shape, dtype=self.dtype, nbytes=self.nbytes,
                          padded=self.padded, home=self.home, state=self.state, tier=self.tier,
                          on_disk=self.on_disk, dirty=self.dirty, future=self.future)

    # --------------------------------------------------- transitions
    def hold(self, raw: torch.Tensor, tier: Tier) -> None:
        """RESIDENT in ``tier`` with a new working copy ``raw`` that no SSD copy matches yet."""
        self.switch_buffer(raw, tier)
        self.state, self.dirty = State.RESIDENT, True

    def start_read(self, raw: torch.Tensor, tier: Tier) -> None:
        """INFLIGHT_IN: ``raw`` in ``tier`` is being filled from the SSD copy."""
        self.switch_buffer(raw, tier)
        self.state, self.dirty = State.INFLIGHT_IN, False

    def rest_on_ssd(self) -> None:
        """ON_SSD: the working copy is gone (its buffer already returned by the caller)."""
        self.switch_buffer(None, Tier.SSD)
        self.state = State.ON_SSD


def tensor_nbytes(shape, dtype: torch.dtype) -> int:
    """Bytes of a dense tensor of ``shape`` and ``dtype``."""
    return int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()


