"""ctypes binding of the native I/O core (``csrc/tsio.c``, built as ``terastack/io/_tsio*.so``).

ctypes releases the GIL for the duration of every foreign call, so a vector of
a million requests is queued, and completions are waited for, without holding
up other Python threads.
"""
from __future__ import annotations

import ctypes
import errno
import importlib.machinery
import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np

_KIND = {"threads": 1, "io_uring": 2}
_MAX_SYSCALL_BYTES = 1 << 30  # TS_MAX_SYSCALL_BYTES in tsio.c
_lib = None
_lib_gil = None
_lib_error: str | None = None
_lib_lock = threading.Lock()


def _find_library() -> Path | None:
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_tsio{suffix}"
        if candidate.exists():
            return candidate
    return None


def load() -> ctypes.CDLL | None:
    """The native library, or None (then :func:`load_error` says why).

    [Note: which calls release the GIL]
    Calls that may block (waiting for completions, starting or joining the
    control-plane threads) go through a CDLL handle, which releases the GIL.
    ``ts_submit`` only copies the request vector into the queue and rings the
    doorbell, so it goes through a PyDLL handle that keeps the GIL: releasing
    and re-acquiring it there made a single small request wait for whichever
    Python thread (often the reaper) grabbed the GIL meanwhile.
    """
    global _lib, _lib_error, _lib_gil
    with _lib_lock:
        if _lib is not None or _lib_error is not None:
            return _lib
        path = _find_library()
        if path is None:
            _lib_error = ("the native core was not built with this install (no compiler at install time?); "
                          "reinstall with gcc available to get the io_uring and threads backends")
            return None
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            _lib_error = f"the native core at {path} failed to load: {exc}"
            return None
        lib.ts_version.restype = ctypes.c_int
        lib.ts_uring_probe.restype = ctypes.c_int
        lib.ts_engine_create.restype = ctypes.c_void_p
        lib.ts_engine_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(ctypes.c_int)]
        lib.ts_reap.restype = ctypes.c_int64
        lib.ts_reap.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        lib.ts_wake_reapers.argtypes = [ctypes.c_void_p]
        lib.ts_set_syscall_limit.restype = ctypes.c_int64
        lib.ts_set_syscall_limit.argtypes = [ctypes.c_int64]
        lib.ts_engine_destroy.argtypes = [ctypes.c_void_p]
        gil = ctypes.PyDLL(str(path))
        gil.ts_submit.restype = ctypes.c_int64
        gil.ts_submit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        _lib, _lib_gil = lib, gil
        return lib


def load_error() -> str | None:
    load()
    return _lib_error


def set_syscall_limit(limit: int) -> int:
    """Cap the bytes one read/write syscall of the native core may move (0: no cap); returns the previous cap.

    Tests use it (through :func:`terastack.io.backend.set_syscall_limit`) to force short transfers.
    """
    lib = load()
    if lib is None:
        return _MAX_SYSCALL_BYTES  # nothing to cap: no native backend can run
    return int(lib.ts_set_syscall_limit(limit))


def uring_unavailable_reason() -> str | None:
    """None when an io_uring ring can be created here, else the reason."""
    lib = load()
    if lib is None:
        return _lib_error
    err = -lib.ts_uring_probe()
    if err == 0:
        return None
    name = errno.errorcode.get(err, str(err))
    return f"io_uring_setup failed with {name} ({os.strerror(err)})"


class NativeBackend:
    """Requests go to the C control plane; one Python thread reaps finished batches.

    Implements :class:`terastack.io.backend.Backend` as the ``io_uring`` and ``threads`` backends.
    """

    def __init__(self, kind: str, *, threads: int, queue_depth: int, rings: int = 1):
        lib = load()
        if lib is None:
            raise RuntimeError(_lib_error)
        err = ctypes.c_int(0)
        workers = rings if kind == "io_uring" else threads
        handle = lib.ts_engine_create(_KIND[kind], workers, max(queue_depth, workers), ctypes.byref(err))
        if not handle:
            code = -err.value
            raise OSError(code, f"cannot start the {kind} backend: {os.strerror(code)}")
        self.name = kind
        self._lib = lib
        self._submit = _lib_gil.ts_submit
        self._handle = handle
        self._pending: dict[int, tuple[Callable[[], None], object]] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._reaper = threading.Thread(target=self._reap_loop, name=f"terastack-io-{kind}-reaper",
                                        daemon=True)
        self._reaper.start()

    def submit(self, requests: np.ndarray, results: np.ndarray, on_done: Callable[[], None]) -> None:
        """Queue ``requests``; ``on_done()`` runs on the reaper thread once ``results`` is filled."""
        n = len(requests)
        # Registered under the lock before the reaper can see the id (it takes the same lock).
        with self._lock:
            if self._closing:
                raise RuntimeError("engine is closed")
            batch = self._submit(self._handle, requests.ctypes.data, n, results.ctypes.data)
            if batch < 0:
                raise OSError(-batch, f"submit failed: {os.strerror(-batch)}")
            self._pending[batch] = (on_done, (requests, results))

    def _reap_loop(self) -> None:
        ids = np.zeros(256, dtype=np.uint64)
        while True:
            got = self._lib.ts_reap(self._handle, ids.ctypes.data, len(ids), 200)
            if got == 0:
                with self._lock:
                    if self._closing and not self._pending:
                        return
                continue
            for batch in ids[:got].tolist():
                with self._lock:
                    on_done, _keepalive = self._pending.pop(batch)
                on_done()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._lib.ts_wake_reapers(self._handle)
        self._reaper.join()
        self._lib.ts_engine_destroy(self._handle)
        self._handle = None
