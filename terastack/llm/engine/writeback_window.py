"""The write-backs of one kind of state in flight, kept within the plan's allowance of bytes.

The optimizer's updated masters and moments and the gradient sums of an accumulated step are both written back
from host buffers that stay charged until their write completes; the plan allows a number of bytes of them in
flight (its write-back buffers). :class:`WritebackWindow` is that allowance for one writer: ``make_room`` before a
new write waits for the oldest ones until the new write fits, ``add`` after it.
"""
from __future__ import annotations

import collections

from terastack import trace


class WritebackWindow:
    """Writes in flight of at most ``limit`` bytes together -- or one write at a time when a write alone is larger
    (the planner's two buffers: the write being filled and the one on its way)."""

    def __init__(self, runtime, limit: int, *, what: str, cat: str):
        """``what``: named by a wait that times out; ``cat``: the trace category of the waits."""
        self.rt = runtime
        self.limit = limit
        self.what = what
        self.cat = cat
        self._writes: collections.deque = collections.deque()  # (future, bytes), oldest first
        self._bytes = 0  # their sum, kept as they come and go

    def add(self, fut, nbytes: int) -> None:
        """A write of ``nbytes`` has been issued (kept even when finished: its error is raised by a later wait)."""
        self._writes.append((fut, nbytes))
        self._bytes += nbytes

    def make_room(self, incoming: int) -> None:
        """Wait for the oldest writes until ``incoming`` more bytes fit the allowance."""
        while self._writes:
            fut, nbytes = self._writes[0]
            if not fut.done() and self._bytes + incoming <= max(self.limit, incoming):
                return
            self._writes.popleft()
            self._bytes -= nbytes
            if fut.done():
                self.rt.wait(fut, self.what)  # at once; raises the write's error, if it failed
                continue
            with trace.span("wait for write-back", track="stall", cat=self.cat):
                self.rt.wait(fut, self.what)

    @property
    def in_flight_bytes(self) -> int:
        """Bytes of the writes kept (some may have finished since)."""
        return self._bytes
