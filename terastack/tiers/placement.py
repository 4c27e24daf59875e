"""Which of the store's directories (one per SSD) receives a record's extent.

[Note: placement over directories]
A store spans one or more directories, each with its own data file. Every
extent lives whole in one directory, chosen when it is allocated (a ``put``,
a ``create``, or a copy-on-write writeback) by a placement policy: a frozen
object with one method, ``place(nbytes, placed) -> index``. ``placed[i]`` is
the bytes of live extents in directory ``i`` at that moment. The policy is
pure: it holds no state of the store and does no I/O, so it may be shared
between stores and is safe to call under the store's lock. The chosen index is
recorded per extent in the manifest, so a policy only decides where *new*
bytes go; changing it never moves existing records.

The default, :class:`StripeBySize`, keeps each directory's share of the live
bytes proportional to its weight (its measured bandwidth when known): reading
a working set back then keeps every SSD busy for about the same time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class PlacementPolicy(Protocol):
    """Chooses the directory of a new extent; see [Note: placement over directories]."""

    def place(self, nbytes: int, placed: Sequence[int]) -> int:
        """Index (``0 <= i < len(placed)``) of the directory to receive ``nbytes`` more bytes."""
        ...


@dataclass(frozen=True, slots=True)
class StripeBySize:
    """Greedy striping by bytes: the extent goes where the directory's load after it, ``(placed + nbytes) /
    weight``, is smallest (ties to the lowest index). Every directory then holds its weighted share of the
    bytes, to within one extent. ``weights`` are per directory (e.g. measured bandwidths; only ratios matter);
    empty means equal."""

    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        weights = tuple(float(w) for w in self.weights)
        if any(not math.isfinite(w) or w <= 0 for w in weights):
            raise ValueError(f"weights: every directory's weight must be a positive number; got {weights}")
        object.__setattr__(self, "weights", weights)

    def check(self, ndirs: int) -> None:
        """Raise if the weights do not describe ``ndirs`` directories."""
        if self.weights and len(self.weights) != ndirs:
            raise ValueError(f"weights: {len(self.weights)} given for {ndirs} directories")

    def place(self, nbytes: int, placed: Sequence[int]) -> int:
        self.check(len(placed))
        weights = self.weights or (1.0,) * len(placed)
        return min(range(len(placed)), key=lambda i: ((placed[i] + nbytes) / weights[i], i))
