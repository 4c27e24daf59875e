"""A disk whose writes (and, if asked, reads) land when a test says so, for what must hold at any pace of the disk.

[Note: a gated disk in tests]
Counts and budgets that hold only while the disk keeps up fail on a loaded machine, where a write-back is still in
flight when the next request for the same record comes. ``gated_disk()`` makes the process-wide storage engine run
every request on the Python backend but hold the completion of each vector that writes until the test opens the
gate: the overlap a slow disk makes by chance happens in every run, by events, not by timing. Reads complete at
once, unless ``gated_disk(reads=True)`` holds them too (a read still in flight when the next request for its record
comes, which a fast disk may never show)."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from terastack.io import IOEngine, backend_names, register_backend, set_engine
from terastack.io.backend import start_backend
from terastack.io.requests import OP_WRITE

NAME = "gated-test-disk"


class GatedDisk:
    """The Python backend, with the completions of writing vectors (``reads``: of every vector) held until
    :meth:`open` (or close)."""

    name = NAME

    def __init__(self, reads: bool = False, **kw):
        self.inner, _ = start_backend("python", **kw)
        self.reads = reads
        self._lock = threading.Condition()
        self._held: list = []   # completions of held vectors, waiting for the gate
        self._open = False

    def submit(self, requests, results, on_done) -> None:
        if not self.reads and not (requests["op"] == OP_WRITE).any():
            self.inner.submit(requests, results, on_done)
            return

        def landed() -> None:
            with self._lock:
                if not self._open:
                    self._held.append(on_done)
                    self._lock.notify_all()
                    return
            on_done()
        self.inner.submit(requests, results, landed)

    def release(self, writes: int = 1, timeout: float = 30.0) -> None:
        """Wait until at least ``writes`` vectors are held, then let every one held complete (later ones are held
        again)."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._held) >= writes, timeout):
                raise TimeoutError(f"{len(self._held)} vectors held after {timeout} s, {writes} expected")
            held, self._held = self._held, []
        for on_done in held:
            on_done()

    def open(self) -> None:
        """Let every write held so far, and every later one, complete."""
        with self._lock:
            self._open = True
        self.release(0)

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def in_flight(self) -> int:
        return self.inner.in_flight + self.held()

    def close(self) -> None:
        self.inner.close()
        self.open()


_started: list[GatedDisk] = []


def _start(**kw) -> GatedDisk:
    disk = GatedDisk(**kw)
    _started.append(disk)
    return disk


@contextmanager
def gated_disk(*, reads: bool = False):
    """The process-wide storage engine, for the block, on a :class:`GatedDisk` (yielded); ``reads``: reads are held
    too."""
    if NAME not in backend_names():
        register_backend(NAME, _start, order=99)
    engine = IOEngine(IOEngine.Config(backend=NAME))
    disk = _started.pop()
    disk.reads = reads  # before the engine's first request
    previous = set_engine(engine)
    try:
        yield disk
    finally:
        disk.open()
        set_engine(previous)
        engine.close()
