"""The pure-Python backend: a thread pool over ``os.preadv``/``os.pwritev``.

It is the last resort when the native core is missing and the reference the
native backends are tested against. It implements
:class:`terastack.io.backend.Backend` (request format and result convention:
:mod:`terastack.io.requests`; bytes moved, or -errno; a read stops early at
end of file).
"""
from __future__ import annotations

import ctypes
import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from terastack.io.requests import OP_READ, OP_WRITE

_MAX_SYSCALL_BYTES = 1 << 30
_syscall_limit = _MAX_SYSCALL_BYTES


def set_syscall_limit(limit: int) -> int:
    global _syscall_limit
    previous = _syscall_limit
    _syscall_limit = limit if 0 < limit < _MAX_SYSCALL_BYTES else _MAX_SYSCALL_BYTES
    return previous


def _transfer(op: int, fd: int, offset: int, length: int, addr: int) -> int:
    done = 0
    zero_writes = 0
    while done < length:
        want = min(length - done, _syscall_limit)
        view = memoryview((ctypes.c_char * want).from_address(addr + done)).cast("B")
        try:
            n = os.preadv(fd, [view], offset + done) if op == OP_READ else os.pwritev(fd, [view], offset + done)
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        if n == 0:
            if op == OP_READ:
                break
            zero_writes += 1
            if zero_writes > 1000:
                return -errno.EIO
            continue
        done += n
    return done


class PythonBackend:
    """The ``python`` backend: each vector is cut into one chunk per worker thread."""

    def __init__(self, *, threads: int):
        self.name = "python"
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="terastack-io-python")
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closed = False

    def submit(self, requests: np.ndarray, results: np.ndarray, on_done: Callable[[], None]) -> None:
        n = len(requests)
        if n == 0:
            if self._closed:
                raise RuntimeError("engine is closed")  # as the native backends say it
            on_done()
            return
        ops, fds = requests["op"].tolist(), requests["fd"].tolist()
        offsets, lengths = requests["offset"].tolist(), requests["length"].tolist()
        addrs = requests["addr"].tolist()
        chunks = [range(s, min(n, s + max(1, -(-n // self._threads))))
                  for s in range(0, n, max(1, -(-n // self._threads)))]
        remaining = [len(chunks)]

        def run(chunk: range) -> None:
            for i in chunk:
                if ops[i] not in (OP_READ, OP_WRITE) or offsets[i] < 0 or lengths[i] < 0 or fds[i] < 0:
                    results[i] = -errno.EINVAL  # as the native core reports it
                else:
                    results[i] = _transfer(ops[i], fds[i], offsets[i], lengths[i], addrs[i])
            with self._lock:
                remaining[0] -= 1
                last = remaining[0] == 0
                if last:
                    self._in_flight -= 1
            if last:
                on_done()

        # Queued under the lock: close() cannot shut the pool down between the check and the last chunk.
        with self._lock:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._in_flight += 1
            for chunk in chunks:
                self._pool.submit(run, chunk)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def close(self) -> None:
        with self._lock:  # no submit gets past its check once this is set
            self._closed = True
        self._pool.shutdown(wait=True)
