"""The storage engine: one object owning the control plane that moves bytes.

``IOEngine`` takes *vectors* of requests. A request list is built with numpy
operations, never a Python call per block, and handed to the backend in one
call; the result is one future per vector with a result per request.

[Note: request planning]
Before submission every request is planned into pieces, vectorized:
  * on a file opened with O_DIRECT, a request whose buffer address and file
    offset agree modulo 4 KiB sends its aligned middle through the O_DIRECT
    descriptor and its unaligned head and tail (if any) through the buffered
    descriptor of the same file; a request whose address and offset disagree
    goes whole through the buffered descriptor. Unaligned requests are thus
    served, never refused, and aligned ones (use an AlignedArena) stay direct.
    Linux flushes dirty page-cache pages before an O_DIRECT read of the same
    range and invalidates them after an O_DIRECT write, so the two paths agree.
  * a piece longer than ``split_bytes`` is cut into pieces of that size, so a
    single large transfer uses the whole queue depth.
Pieces of one request stay adjacent, so per-request results are sums over
contiguous runs (``np.add.reduceat``).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from terastack import trace
from terastack.io import _native
from terastack.io._native import OP_READ, OP_WRITE, REQUEST_DTYPE
from terastack.io.buffers import DIRECT_ALIGN
from terastack.io.errors import BatchError, EndOfFileError, StorageError
from terastack.io.futures import Future

BACKENDS = ("auto", "io_uring", "threads", "python")
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

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: "auto" picks io_uring, then threads, then python, and records why in ``backend_reason``.
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
            if self.backend not in BACKENDS:
                raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
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
        self._backend, self.backend_reason = _start_backend(config)
        self.backend: str = self._backend.name
        self.stats = IOStats()
        self._closed = False

    # ------------------------------------------------------------------ files
    def open(self, path: str | os.PathLike, mode: str = "r", *, direct: bool | str = "auto",
             size: int | None = None):
        """Open ``path`` with this engine. See :class:`terastack.io.File`."""
        from terastack.io.file import File

        return File(path, mode, direct=direct, size=size, engine=self)

    # --------------------------------------------------------------- requests
    def submit_vector(self, op: int, files: Sequence, file_index: np.ndarray | None, buffer_address: int,
                      buffer_offsets: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, *,
                      keepalive: object = None, what: str | None = None, single: bool = False,
                      then=None) -> Future:
        """Queue ``len(offsets)`` requests of one kind over ``files`` in one call.

        Request i moves ``lengths[i]`` bytes between ``files[file_index[i]]`` at
        ``offsets[i]`` and the buffer at ``buffer_address + buffer_offsets[i]``.
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
        fd_buffered = np.array([f._fd for f in files], dtype=np.int32)[file_index]
        fd_direct = np.array([f._direct_fd for f in files], dtype=np.int32)[file_index]
        addrs = np.uint64(buffer_address) + buffer_offsets.astype(np.uint64)
        requests, parent = plan_requests(op, fd_buffered, fd_direct, addrs, offsets, lengths,
                                         self.config.split_bytes)
        results = np.empty(len(requests), dtype=np.int64)
        future = Future()
        started = time.perf_counter()
        label = what or ("read" if op == OP_READ else "write")

        def on_done() -> None:
            try:
                per_request = _collect(results, parent, n)
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
                for f in files:
                    f._request_done()

        for f in files:
            f._request_started()
        # Everything a request points into stays referenced until on_done has run.
        future._keepalive = (keepalive, requests, results)
        try:
            self._backend.submit(requests, results, on_done)
        except BaseException:
            for f in files:
                f._request_done()
            raise
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


def _start_backend(config: IOEngine.Config):
    from terastack.io._python_backend import PythonBackend

    order = ["io_uring", "threads", "python"] if config.backend == "auto" else [config.backend]
    skipped: list[str] = []
    for name in order:
        if name == "python":
            why = "selected" if config.backend == "python" else "auto chose python (" + "; ".join(skipped) + ")"
            return PythonBackend(threads=config.threads), why
        reason = _native.load_error()
        if reason is None and name == "io_uring":
            reason = _native.uring_unavailable_reason()
        if reason is None:
            try:
                rings = config.rings or max(1, min(4, os.cpu_count() or 1))
                backend = _native.NativeBackend(name, threads=config.threads, queue_depth=config.queue_depth,
                                                rings=rings)
            except OSError as exc:
                reason = str(exc)
            else:
                if config.backend != "auto":
                    return backend, "selected"
                return backend, "auto chose " + name + (" (" + "; ".join(skipped) + ")" if skipped else "")
        if config.backend != "auto":
            raise RuntimeError(f"I/O backend {name!r} is not available here: {reason}")
        skipped.append(f"{name} unavailable: {reason}")
    raise AssertionError("unreachable: the python backend always starts")


def plan_requests(op: int, fd_buffered: np.ndarray, fd_direct: np.ndarray, addrs: np.ndarray,
                  offsets: np.ndarray, lengths: np.ndarray, split_bytes: int):
    """Requests for the native core and, per piece, the index of the request it belongs to.

    See [Note: request planning].
    """
    n = len(offsets)
    offsets = offsets.astype(np.int64, copy=False)
    lengths = lengths.astype(np.int64, copy=False)
    parent = np.arange(n, dtype=np.int64)
    fds = fd_buffered
    whole_direct = ((fd_direct >= 0).all() and (lengths > 0).all()
                    and not ((offsets | lengths | addrs.astype(np.int64)) % DIRECT_ALIGN).any())
    if whole_direct:
        fds = fd_direct  # every request aligned (the common case): no buffered head or tail pieces to split off
    elif (fd_direct >= 0).any():
        a = DIRECT_ALIGN
        ends = offsets + lengths
        start_al = -(-offsets // a) * a
        end_al = ends // a * a
        congruent = (addrs.astype(np.int64) - offsets) % a == 0
        split = (fd_direct >= 0) & (end_al > start_al) & congruent
        zero = np.zeros(n, dtype=np.int64)
        piece_off = np.stack([offsets, np.where(split, start_al, 0), np.where(split, end_al, 0)], axis=1)
        piece_len = np.stack([np.where(split, start_al - offsets, lengths),
                              np.where(split, end_al - start_al, zero),
                              np.where(split, ends - end_al, zero)], axis=1)
        piece_fd = np.stack([fd_buffered, np.where(split, fd_direct, fd_buffered), fd_buffered], axis=1)
        keep = piece_len > 0
        keep[:, 0] |= ~keep.any(axis=1)  # a zero-length request still gets its (empty) piece
        keep = keep.ravel()
        parent = np.repeat(parent, 3)[keep]
        offsets_p = piece_off.ravel()[keep]
        addrs = (addrs[parent].astype(np.int64) + (offsets_p - offsets[parent])).astype(np.uint64)
        offsets, lengths, fds = offsets_p, piece_len.ravel()[keep], piece_fd.ravel()[keep]
    if (lengths > split_bytes).any():
        pieces = np.maximum(1, -(-lengths // split_bytes))
        owner = np.repeat(np.arange(len(lengths)), pieces)
        k = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        step = k * split_bytes
        offsets, addrs = offsets[owner] + step, addrs[owner] + step.astype(np.uint64)
        lengths = np.minimum(split_bytes, lengths[owner] - step)
        fds, parent = fds[owner], parent[owner]
    requests = np.empty(len(offsets), dtype=REQUEST_DTYPE)
    requests["op"] = op
    requests["fd"] = fds
    requests["offset"] = offsets
    requests["length"] = lengths
    requests["addr"] = addrs
    return requests, parent


def _collect(results: np.ndarray, parent: np.ndarray, n: int) -> np.ndarray:
    """Per-request outcome from per-piece outcomes: bytes summed, or the first piece's -errno."""
    if len(results) == n:
        return results.copy()
    starts = np.flatnonzero(np.r_[True, parent[1:] != parent[:-1]])
    bad = results < 0
    totals = np.add.reduceat(np.where(bad, 0, results), starts)
    if bad.any():
        first_bad = np.flatnonzero(bad)
        owners, where = np.unique(parent[first_bad], return_index=True)
        totals[owners] = results[first_bad[where]]
    return totals


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
