"""The storage engine: one object owning the control plane that moves bytes.

``IOEngine`` takes *vectors* of requests. A request list is built with numpy
operations, never a Python call per block, and handed to the backend in one
call; the result is one future per vector with a result per request. How a
vector is cut into pieces before it reaches the backend is
[Note: request planning] in :mod:`terastack.io.requests`; the backends and how
one is chosen are in :mod:`terastack.io.backend`.

[Note: engine and file without an import cycle]
A File is served by an engine, and ``File(path)`` without one takes the
process-wide engine, so ``terastack.io.file`` imports this module. The engine
needs of a file only its public surface (``path``, ``fileno()``,
``direct_fileno()``) and never imports ``terastack.io.file``: :meth:`IOEngine.open`
makes an :attr:`IOEngine.file_type`, which ``terastack.io.file`` sets to
``File`` when it is imported (``import terastack.io`` always imports it).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import numpy as np

from terastack import trace
from terastack.constants import DIRECT_ALIGN
from terastack.io.backend import Backend, backend_names, start_backend
from terastack.io.storage_errors import BatchError, EndOfFileError, StorageError
from terastack.io.futures import Future
from terastack.io.requests import OP_READ, OP_WRITE, op_name, per_request_results, plan_requests

#: How many failed requests of a batch get their own exception object (the rest are counted).
_MAX_ERROR_OBJECTS = 32


@dataclass(slots=True)
class IOStats:
    """Traffic through one engine since it started (bytes actually moved)."""

    bytes_read: int = 0
    bytes_written: int = 0
    requests: int = 0
    batches: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, read: int, written: int, requests: int) -> None:
        with self._lock:
            self.bytes_read += read
            self.bytes_written += written
            self.requests += requests
            self.batches += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {"bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                    "requests": self.requests, "batches": self.batches}


class IOEngine:
    """Owns the I/O threads or ring. Use :meth:`open` to get files served by it."""

    #: What :meth:`open` makes: terastack.io.File, set by terastack.io.file
    #: (see [Note: engine and file without an import cycle]).
    file_type: ClassVar[type | None] = None

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: a registered backend (terastack.io.backend), or "auto": io_uring, then threads, then python,
        #: recording why in ``backend_reason``
        backend: str = "auto"
        #: worker threads of the threads and python backends (blocking syscalls: more threads, more queue depth)
        threads: int = 32
        #: requests the io_uring rings keep in flight, all rings together
        queue_depth: int = 128
        #: io_uring rings, each driven by its own control thread (0: one per core, at most 4)
        rings: int = 0
        #: requests larger than this are cut into pieces of this size (a multiple of 4 KiB)
        split_bytes: int = 1 << 20

        def __post_init__(self) -> None:
            names = ("auto",) + backend_names()
            if self.backend not in names:
                raise ValueError(f"backend: must be one of {', '.join(names)}; got {self.backend!r}")
            if not 1 <= self.threads <= 1024:
                raise ValueError(f"threads: must be in 1..1024, got {self.threads}")
            if not 0 <= self.rings <= 64:
                raise ValueError(f"rings: must be in 0..64, got {self.rings}")
            if not 1 <= self.queue_depth <= 4096:
                raise ValueError(f"queue_depth: must be in 1..4096, got {self.queue_depth}")
            if self.split_bytes < DIRECT_ALIGN or self.split_bytes % DIRECT_ALIGN:
                raise ValueError(f"split_bytes: must be a positive multiple of {DIRECT_ALIGN}, "
                                 f"got {self.split_bytes}")

    def __init__(self, config: "IOEngine.Config | None" = None, **fields):
        if config is None:
            config = IOEngine.Config(**fields)
        elif fields:
            raise TypeError("pass either a Config or keyword fields, not both")
        self.config = config
        self._backend: Backend
        self._backend, self.backend_reason = start_backend(config.backend, threads=config.threads,
                                                           queue_depth=config.queue_depth, rings=config.rings)
        self.backend: str = self._backend.name
        self.stats = IOStats()
        self._closed = False

    # ------------------------------------------------------------------ files
    def open(self, path: str | os.PathLike, mode: str = "r", *, direct: bool | str = "auto",
             size: int | None = None):
        """Open ``path`` with this engine. See :class:`terastack.io.File`."""
        return self.file_type(path, mode, direct=direct, size=size, engine=self)

    # --------------------------------------------------------------- requests
    def submit_vector(self, op: int, files: Sequence, file_index: np.ndarray | None, buffer_address: int,
                      buffer_offsets: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, *,
                      keepalive: object = None, what: str | None = None, single: bool = False,
                      then=None) -> Future:
        """Queue ``len(offsets)`` requests of one kind over ``files`` in one call.

        Request i moves ``lengths[i]`` bytes between ``files[file_index[i]]`` at
        ``offsets[i]`` and the buffer at ``buffer_address + buffer_offsets[i]``.
        Of a file the engine uses ``fileno()``, ``direct_fileno()`` (-1: no
        O_DIRECT descriptor) and ``path`` (for errors); each must stay open
        until the future is done (``File`` counts its requests for that).
        Arguments are trusted here (``File`` validates them); the future's
        result is an int64 array of bytes moved per request, or it raises
        :class:`BatchError` listing each failure with its path, offset, length.
        With ``single=True`` (one request) the result is that request's int and
        the error its own StorageError. ``then(result)``, if given, runs before
        the future completes and its return value becomes the result.
        """
        if self._closed:
            raise RuntimeError("IOEngine is closed")
        n = len(offsets)
        if file_index is None:
            file_index = np.zeros(n, dtype=np.int64)
        fd_buffered = np.array([f.fileno() for f in files], dtype=np.int32)[file_index]
        fd_direct = np.array([f.direct_fileno() for f in files], dtype=np.int32)[file_index]
        addrs = np.uint64(buffer_address) + buffer_offsets.astype(np.uint64)
        requests, parent = plan_requests(op, fd_buffered, fd_direct, addrs, offsets, lengths,
                                         self.config.split_bytes)
        results = np.empty(len(requests), dtype=np.int64)
        future = Future()
        started = time.perf_counter()
        label = what or op_name(op)
        # Everything a request points into stays referenced until on_done has run (the backend holds on_done).
        pinned = (keepalive, requests, results)

        def on_done() -> None:
            nonlocal pinned
            try:
                per_request = per_request_results(results, parent, n)
                moved = int(per_request[per_request > 0].sum())
                self.stats.add(moved if op == OP_READ else 0, moved if op == OP_WRITE else 0, n)
                if trace.tracer.enabled:
                    trace.interval(f"{label} x{n}", started, time.perf_counter(), track="io",
                                   cat="io", bytes=moved, backend=self.backend)
                error = _errors(op, per_request, files, file_index, offsets, lengths, label)
                if error is not None:
                    future.set_exception(error.errors[0] if single else error)
                else:
                    result = int(per_request[0]) if single else per_request
                    future.set_result(then(result) if then is not None else result)
            except BaseException as exc:  # noqa: BLE001 - must reach the waiter, never the reaper
                future.set_exception(exc)
            finally:
                pinned = None

        self._backend.submit(requests, results, on_done)
        return future

    @property
    def in_flight(self) -> int:
        return self._backend.in_flight

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __enter__(self) -> "IOEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IOEngine(backend={self.backend!r})"


def _errors(op: int, per_request: np.ndarray, files, file_index, offsets, lengths, what: str):
    short = per_request < lengths if op == OP_READ else per_request < 0
    failed = np.flatnonzero(short | (per_request < 0))
    if len(failed) == 0:
        return None
    errors: list[StorageError] = []
    for i in failed[:_MAX_ERROR_OBJECTS].tolist():
        path = files[int(file_index[i])].path
        got = int(per_request[i])
        if got < 0:
            errors.append(StorageError(-got, what, path=path, offset=int(offsets[i]), length=int(lengths[i])))
        else:
            errors.append(EndOfFileError(path=path, offset=int(offsets[i]), length=int(lengths[i]), got=got))
    if len(failed) > _MAX_ERROR_OBJECTS:
        errors[-1].strerror += f" ({len(failed) - _MAX_ERROR_OBJECTS} further failures not itemized)"
    return BatchError(errors, per_request)


_default: IOEngine | None = None
_default_lock = threading.Lock()


def get_engine() -> IOEngine:
    """The process-wide engine (backend from ``TERASTACK_IO_BACKEND``, default auto)."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = IOEngine(backend=os.environ.get("TERASTACK_IO_BACKEND", "auto"))
        return _default


def set_engine(engine: IOEngine) -> IOEngine | None:
    """Make ``engine`` the process-wide engine; returns the previous one (not closed)."""
    global _default
    with _default_lock:
        previous, _default = _default, engine
        return previous
