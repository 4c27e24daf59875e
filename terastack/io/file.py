"""Files served by an :class:`~terastack.io.engine.IOEngine`.

``pread``/``pwrite`` return futures; ``read``/``write`` are the same calls
followed by ``.result()``. ``pread_many``/``pwrite_many`` move a whole vector
of extents between the file and one buffer in one call;
``pread_buffers``/``pwrite_buffers`` between the file and one buffer per
extent.

Bad input raises at call time (the request is never queued): a closed file,
a negative offset, a buffer smaller than the length, a read-only buffer for a
read, a write to a file opened for reading. Failures of the transfer itself
(ENOSPC, EFBIG, EIO, end of file) arrive through the future. Every exception
carries errno, path, offset and length.
"""
from __future__ import annotations

import errno
import os
import threading
import time

import numpy as np

from terastack.constants import DIRECT_ALIGN, round_up
from terastack.io.buffers import view_buffer
from terastack.io.engine import IOEngine, get_engine
from terastack.io.storage_errors import ClosedFileError, InvalidRequestError, StorageError
from terastack.io.futures import Future
from terastack.io.requests import OP_READ, OP_WRITE, op_name

_ZERO = np.zeros(1, np.int64)
_MODES = {
    "r": os.O_RDONLY,
    "r+": os.O_RDWR,
    "w": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "x": os.O_RDWR | os.O_CREAT | os.O_EXCL,
    "a": os.O_RDWR | os.O_CREAT,  # create if missing, keep contents; offsets stay explicit
}


class File:
    """A file on local storage, read and written through the engine.

    ``direct``: True opens an O_DIRECT descriptor too and fails if the file
    system refuses it; "auto" tries and records why not in ``direct_reason``;
    False never uses O_DIRECT.
    """

    def __init__(self, path: str | os.PathLike, mode: str = "r", *, direct: bool | str = "auto",
                 size: int | None = None, engine: IOEngine | None = None):
        if mode not in _MODES:
            raise ValueError(f"mode: must be one of {', '.join(_MODES)}; got {mode!r}")
        if direct not in (True, False, "auto"):
            raise ValueError(f"direct: must be True, False or 'auto'; got {direct!r}")
        self.engine = engine or get_engine()
        self.path = os.fspath(path)
        self.mode = mode
        self.writable = mode != "r"
        self._fd = -1
        self._direct_fd = -1
        self._closed = True
        self._in_flight = 0
        self._idle = threading.Condition()
        try:
            self._fd = os.open(self.path, _MODES[mode] | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageError(exc.errno, "open", path=self.path, detail=exc.strerror) from None
        self._closed = False
        self.direct_reason = "not requested" if direct is False else None
        if direct is not False:
            try:
                flags = (os.O_RDONLY if mode == "r" else os.O_RDWR) | os.O_DIRECT | os.O_CLOEXEC
                self._direct_fd = os.open(self.path, flags)
            except OSError as exc:
                self.direct_reason = f"O_DIRECT refused by the file system ({exc.strerror})"
                if direct is True:
                    self.close()
                    raise StorageError(exc.errno, "open with O_DIRECT", path=self.path,
                                       detail=self.direct_reason) from None
        if size is not None:
            self.allocate(size)

    # ------------------------------------------------------------ properties
    @property
    def direct(self) -> bool:
        """Whether aligned requests go through O_DIRECT."""
        return self._direct_fd >= 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size(self) -> int:
        self._check_open("stat")
        return os.fstat(self._fd).st_size

    def fileno(self) -> int:
        """The buffered descriptor (-1 once closed)."""
        return self._fd

    def direct_fileno(self) -> int:
        """The O_DIRECT descriptor of the same file, or -1 when there is none (see :attr:`direct`)."""
        return self._direct_fd

    # ------------------------------------------------------------- requests
    def pread(self, buf, offset: int, length: int | None = None) -> Future:
        """Read ``length`` bytes (default: the buffer's size) at ``offset`` into ``buf``. Future of bytes read.

        A read past the end of the file fails with :class:`EndOfFileError`.
        """
        return self._single(OP_READ, buf, offset, length)

    def pwrite(self, buf, offset: int, length: int | None = None, *, pad: bool = False) -> Future:
        """Write ``length`` bytes (default: the buffer's size) of ``buf`` at ``offset``. Future of bytes written.

        ``pad=True`` is for writing the *end* of an O_DIRECT file from an
        aligned buffer with room to spare (an :class:`ArenaBuffer`): the write
        is padded to a whole 4 KiB block so it stays direct, and the file is
        then truncated back to ``offset + length``.
        """
        return self._single(OP_WRITE, buf, offset, length, pad=pad)

    def read(self, buf, offset: int, length: int | None = None, *, timeout: float | None = None) -> int:
        return self.pread(buf, offset, length).result(timeout)

    def write(self, buf, offset: int, length: int | None = None, *, pad: bool = False,
              timeout: float | None = None) -> int:
        return self.pwrite(buf, offset, length, pad=pad).result(timeout)

    def pread_many(self, buf, offsets, lengths, buffer_offsets=None) -> Future:
        """Read extent i (``offsets[i]``, ``lengths[i]``) into ``buf`` at ``buffer_offsets[i]``.

        ``buffer_offsets`` defaults to the extents packed back to back. One call,
        one future whose result is the array of bytes read per extent.
        """
        return self._many(OP_READ, buf, offsets, lengths, buffer_offsets)

    def pwrite_many(self, buf, offsets, lengths, buffer_offsets=None) -> Future:
        """Write ``buf`` at ``buffer_offsets[i]`` to the file at ``offsets[i]``; see :meth:`pread_many`."""
        return self._many(OP_WRITE, buf, offsets, lengths, buffer_offsets)

    def pread_buffers(self, bufs, offsets, lengths=None) -> Future:
        """Read extent i (``offsets[i]``, ``lengths[i]``, default each buffer's size) into ``bufs[i]``: one call,
        one future whose result is the array of bytes read per extent."""
        return self._buffers(OP_READ, bufs, offsets, lengths)

    def pwrite_buffers(self, bufs, offsets, lengths=None) -> Future:
        """Write ``bufs[i]`` to the file at ``offsets[i]``; see :meth:`pread_buffers`."""
        return self._buffers(OP_WRITE, bufs, offsets, lengths)

    # ----------------------------------------------------- file maintenance
    def allocate(self, size: int) -> None:
        """Reserve ``size`` bytes of disk (fallocate), so later writes cannot fail for space mid-way."""
        self._check_open("allocate", 0, size)
        self._check_writable("allocate", 0, size)
        try:
            os.posix_fallocate(self._fd, 0, size)
        except OSError as exc:
            raise StorageError(exc.errno, "allocate", path=self.path, offset=0, length=size) from None

    def truncate(self, size: int) -> None:
        self._check_open("truncate", size, 0)
        self._check_writable("truncate", size, 0)
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            raise StorageError(exc.errno, "truncate", path=self.path, offset=size, length=0) from None

    def sync(self) -> None:
        """fdatasync: everything written so far is on stable storage when this returns."""
        self._check_open("sync")
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            raise StorageError(exc.errno, "fdatasync", path=self.path) from None

    def drop_cache(self) -> None:
        """Evict this file from the page cache (after syncing dirty pages) so the next read is cold."""
        self._check_open("drop_cache")
        if self.writable:
            self.sync()
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request of this file is in flight; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float | None = 60.0) -> None:
        """Wait for this file's requests, then close it. Raises (and keeps it open) if they outlast ``timeout``."""
        if self._closed:
            return
        if not self.wait_idle(timeout):
            raise StorageError(errno.ETIMEDOUT, "close", path=self.path,
                               detail=f"{self._in_flight} requests still in flight after {timeout} s")
        self._closed = True
        for fd in (self._direct_fd, self._fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._direct_fd = -1

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and not self._in_flight:
            for fd in (self._direct_fd, self._fd):
                if fd >= 0:
                    os.close(fd)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("direct" if self.direct else "buffered")
        return f"File({self.path!r}, mode={self.mode!r}, {state})"

    # --------------------------------------------------------------- helpers
    def _submit(self, op: int, buffer_address: int, buffer_offsets: np.ndarray, offsets: np.ndarray,
                lengths: np.ndarray, **kwargs) -> Future:
        """One request vector over this file through the engine, counted in flight until its future is done
        (what :meth:`wait_idle` and :meth:`close` wait for)."""
        with self._idle:
            self._in_flight += 1
        try:
            future = self.engine.submit_vector(op, [self], None, buffer_address, buffer_offsets, offsets,
                                               lengths, **kwargs)
        except BaseException:
            self._request_done()
            raise
        future.add_done_callback(self._request_done)
        return future

    def _request_done(self, _future: Future | None = None) -> None:
        with self._idle:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.notify_all()

    def _check_open(self, what: str, offset: int | None = None, length: int | None = None) -> None:
        if self._closed:
            raise ClosedFileError(what, path=self.path, offset=offset, length=length)

    def _check_writable(self, what: str, offset, length) -> None:
        if not self.writable:
            raise StorageError(errno.EBADF, what, path=self.path, offset=offset, length=length,
                               detail="file was opened read-only (mode 'r')")

    def _check_request(self, op: int, offset: int | None = None, length: int | None = None) -> str:
        """The verb of ``op`` ("read"/"write") once this file can take it: open, and writable for a write."""
        what = op_name(op)
        self._check_open(what, offset, length)
        if op == OP_WRITE:
            self._check_writable(what, offset, length)
        return what

    def _view(self, op: int, buf, offset: int | None = None, length: int | None = None, *, label: str = ""):
        """Where ``buf``'s bytes are; a buffer the request cannot use raises InvalidRequestError."""
        try:
            return view_buffer(buf, writable=op == OP_READ)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(op_name(op), path=self.path, offset=offset, length=length,
                                      detail=f"{label}{exc}") from None

    def _single(self, op: int, buf, offset: int, length: int | None, *, pad: bool = False) -> Future:
        if _is_device_tensor(buf):
            from terastack.io.staged import staged_transfer

            return staged_transfer(self, op, buf, offset, length)
        what = self._check_request(op, offset, length)
        view = self._view(op, buf, offset, length)
        if length is None:
            length = view.nbytes
        if not isinstance(offset, (int, np.integer)) or offset < 0:
            raise InvalidRequestError(what, path=self.path, offset=offset, length=length,
                                      detail=f"offset must be a non-negative integer, got {offset!r}")
        if not isinstance(length, (int, np.integer)) or length < 0:
            raise InvalidRequestError(what, path=self.path, offset=offset, length=length,
                                      detail=f"length must be a non-negative integer, got {length!r}")
        if length > view.nbytes:
            raise InvalidRequestError(what, path=self.path, offset=offset, length=length,
                                      detail=f"buffer too small: holds {view.nbytes} bytes, request needs {length}")
        true_end = None
        if pad and self.direct and length % DIRECT_ALIGN:
            padded = round_up(length, DIRECT_ALIGN)
            if padded <= view.capacity and offset % DIRECT_ALIGN == 0:
                true_end, length = offset + length, padded
        then = None
        if true_end is not None:
            def then(_moved: int) -> int:
                self.truncate(true_end)
                return true_end - offset
        return self._submit(op, view.address, _ZERO, np.array([offset], np.int64), np.array([length], np.int64),
                            keepalive=view.owner, what=what, single=True, then=then)

    def _many(self, op: int, buf, offsets, lengths, buffer_offsets) -> Future:
        what = self._check_request(op)
        view = self._view(op, buf)
        offsets = np.asarray(offsets, dtype=np.int64).ravel()
        lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), offsets.shape)
        if buffer_offsets is None:
            buffer_offsets = np.cumsum(lengths) - lengths
        else:
            buffer_offsets = np.broadcast_to(np.asarray(buffer_offsets, dtype=np.int64), offsets.shape)
        validate_extents(what, self.path, view.nbytes, offsets, lengths, buffer_offsets)
        return self._submit(op, view.address, buffer_offsets, offsets, lengths, keepalive=view.owner, what=what)

    def _buffers(self, op: int, bufs, offsets, lengths) -> Future:
        what = self._check_request(op)
        views = []
        for i, buf in enumerate(bufs):
            if _is_device_tensor(buf):
                raise InvalidRequestError(what, path=self.path, offset=None, length=None,
                                          detail=f"buffer {i} is on an accelerator; use pread/pwrite for those")
            views.append(self._view(op, buf, label=f"buffer {i}: "))
        offsets = np.asarray(offsets, dtype=np.int64).ravel()
        if len(offsets) != len(views):
            raise InvalidRequestError(what, path=self.path, offset=None, length=None,
                                      detail=f"{len(views)} buffers but {len(offsets)} offsets")
        sizes = np.array([v.nbytes for v in views], dtype=np.int64)
        lengths = sizes if lengths is None else np.broadcast_to(np.asarray(lengths, dtype=np.int64), offsets.shape)
        addresses = np.array([v.address for v in views], dtype=np.uint64)
        too_small = np.flatnonzero(lengths > sizes)
        if len(too_small):
            i = int(too_small[0])
            raise InvalidRequestError(what, path=self.path, offset=int(offsets[i]), length=int(lengths[i]),
                                      detail=f"buffer {i} too small: holds {int(sizes[i])} bytes")
        validate_extents(what, self.path, int(lengths.max(initial=0)), offsets, lengths,
                         np.zeros_like(offsets))
        return self._submit(op, 0, addresses, offsets, lengths, keepalive=[v.owner for v in views], what=what)


def validate_extents(what: str, path: str, nbytes: int, offsets: np.ndarray, lengths: np.ndarray,
                     buffer_offsets: np.ndarray) -> None:
    """Vectorized checks of a request vector; raises InvalidRequestError naming the first bad request."""
    for name, bad in (("offset must be >= 0", offsets < 0), ("length must be >= 0", lengths < 0),
                      ("buffer offset must be >= 0", buffer_offsets < 0),
                      (f"buffer too small: holds {nbytes} bytes", buffer_offsets + lengths > nbytes)):
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidRequestError(what, path=path, offset=int(offsets[i]), length=int(lengths[i]),
                                      detail=f"request {i}: {name} (buffer offset {int(buffer_offsets[i])})")


def _is_device_tensor(buf) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(buf, torch.Tensor) and buf.device.type != "cpu"


IOEngine.file_type = File  # what IOEngine.open makes; see [Note: engine and file without an import cycle]


def open(path: str | os.PathLike, mode: str = "r", *, direct: bool | str = "auto", size: int | None = None,
         engine: IOEngine | None = None) -> File:  # noqa: A001 - mirrors the builtin on purpose
    """Open ``path`` on ``engine`` (default: the process-wide engine)."""
    return File(path, mode, direct=direct, size=size, engine=engine)
