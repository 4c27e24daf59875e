"""A disk whose writes (and, if asked, reads) land when a test says so, for what must hold at any pace of the disk.

[Note: a gated disk in tests]
Counts and budgets that hold only while the disk keeps up fail on a loaded machine, where a write-back is still in
flight when the next request for the same record comes. ``gated_disk()`` makes the process-wide storage engine run
every request on the Python backend but hold the completion of each vector that writes until the test opens the
gate: the overlap a slow disk makes by chance happens in every run, by events, not by timing. Reads complete at
once, unless ``gated_disk(reads=True)`` holds them too (a read still in flight when the next request for its record
comes, which a fast disk may never show).

[Note: a lagging disk in tests]
A test of a whole training step cannot open the gate by hand at each write. ``gated_disk(lagging=True)`` holds each
write's completion until the engine submits a later vector, so every write-back is still in flight when the next
request is made, in every run; when the engine submits nothing for a moment (it waits for that write) the writes
held land. How long a write lags varies with the machine; that it lags past the next request does not. What holds
at any pace of the disk must hold here, counted (``lagged``: the writes that did)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from terastack.io import IOEngine, backend_names, register_backend, set_engine
from terastack.io.backend import start_backend, unregister_backend
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


class LaggingDisk:
    """The Python backend, with the completion of each writing vector held until a later vector is submitted, or
    until the engine has submitted nothing for ``idle_s`` (it is waiting for that write: a step's end). See
    [Note: a lagging disk in tests]. Completions run on the disk's own thread, never inside ``submit`` (whose
    caller may hold its own lock)."""

    name = NAME

    def __init__(self, idle_s: float = 0.05, **kw):
        self.inner, _ = start_backend("python", **kw)
        self.idle_s = idle_s
        self.lagged = 0            # writes that completed only after a later vector was submitted
        self._lock = threading.Condition()
        self._submitted = 0        # vectors submitted so far
        self._last = time.monotonic()
        self._held: list = []      # (vectors submitted when it was, completion) of writes landed but held
        self._closed = False
        self._thread = threading.Thread(target=self._complete, name="lagging-disk", daemon=True)
        self._thread.start()

    def submit(self, requests, results, on_done) -> None:
        writes = bool((requests["op"] == OP_WRITE).any())
        with self._lock:
            self._submitted += 1
            self._last = time.monotonic()
            seq = self._submitted
            self._lock.notify_all()
        if not writes:
            self.inner.submit(requests, results, on_done)
            return

        def landed() -> None:
            with self._lock:
                if not self._closed:
                    self._held.append((seq, on_done))
                    self._lock.notify_all()
                    return
            on_done()
        self.inner.submit(requests, results, landed)

    def _due(self) -> tuple[list, bool]:
        """The completions to run now (lock held), and whether a later vector was submitted for them."""
        later = [h for h in self._held if h[0] < self._submitted]
        if later:
            return later, True
        if self._held and (self._closed or time.monotonic() - self._last >= self.idle_s):
            return list(self._held), False
        return [], False

    def _complete(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._closed or self._due()[0], timeout=self.idle_s)
                due, lagged = self._due()
                self._held = [h for h in self._held if h not in due]
                self.lagged += len(due) if lagged else 0
                if self._closed and not due and not self._held:
                    return
            for _, on_done in due:
                on_done()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self.inner.in_flight + len(self._held)

    def open(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(30)

    def close(self) -> None:
        self.inner.close()
        self.open()


_started: list = []


_kind = [GatedDisk]


def _start(**kw):
    disk = _kind[0](**kw)
    _started.append(disk)
    return disk


@contextmanager
def gated_disk(*, reads: bool = False, lagging: bool = False):
    """The process-wide storage engine, for the block, on a :class:`GatedDisk` (yielded); ``reads``: reads are held
    too; ``lagging``: on a :class:`LaggingDisk` instead."""
    # registered for the block only: a test after it in the same process sees the backends it had
    registered = NAME not in backend_names()
    if registered:
        register_backend(NAME, _start, order=99)
    try:
        _kind[0] = LaggingDisk if lagging else GatedDisk
        engine = IOEngine(IOEngine.Config(backend=NAME))
        disk = _started.pop()
        if not lagging:
            disk.reads = reads  # before the engine's first request
        previous = set_engine(engine)
        try:
            yield disk
        finally:
            disk.open()
            set_engine(previous)
            engine.close()
    finally:
        if registered:
            unregister_backend(NAME)
