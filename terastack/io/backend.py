"""The backend protocol and the one registry the engine picks backends from.

A backend moves the bytes of request vectors (:mod:`terastack.io.requests`);
everything above it (planning, per-request errors, futures, statistics) is the
engine's. Three are built in, tried by ``backend="auto"`` in this order:

========== ======================================================== =====
name       what runs the requests                                   order
========== ======================================================== =====
io_uring   native core: io_uring rings, each with a control thread   10
threads    native core: a pthread pool over preadv/pwritev           20
python     a Python thread pool over os.preadv/os.pwritev            30
========== ======================================================== =====

Add one with :func:`register_backend` (see docs/storage-engine.md, "Adding a
backend"); ``tests/io/test_backend_contract.py`` then checks it against the
contract below with the others.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from terastack.io import _native, _python_backend


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a backend.

    ``submit(requests, results, on_done)`` queues one request vector and returns
    without waiting for it:

    * ``requests`` is a numpy array of :data:`~terastack.io.requests.REQUEST_DTYPE`;
      entry i asks to move ``length`` bytes between descriptor ``fd`` at file
      ``offset`` and memory at ``addr`` (``op`` is ``OP_READ``: file to memory,
      ``OP_WRITE``: memory to file). Requests of one vector may run in any order
      and concurrently; the caller never puts overlapping writes in one vector.
    * ``results`` is an int64 array of the same length that the backend fills:
      ``results[i]`` = bytes moved by request i, or ``-errno`` if it failed.
      Short transfers, ``EINTR`` and ``EAGAIN`` are retried until the request is
      complete; only a read that reaches the end of the file stops early (its
      result is then smaller than ``length``). A malformed request (an ``op``
      other than read/write, a negative ``fd``, ``offset`` or ``length``) gets
      ``-EINVAL`` and does not stop the others. Failures are reported through
      ``results`` only, never raised from a worker.
    * ``on_done()`` is called exactly once, after every entry of ``results`` is
      written, on any thread (a backend thread, or the submitting thread before
      ``submit`` returns, e.g. for an empty vector). It must not be called while
      the backend holds a lock that ``submit`` or ``in_flight`` takes.
    * Buffers belong to the caller: ``requests``, ``results`` and the memory at
      every ``addr`` stay valid until ``on_done`` has run (the engine keeps them
      referenced); the backend neither frees nor keeps them afterwards, and
      never closes a descriptor.
    * ``submit`` raises (``OSError`` with the errno, or ``RuntimeError`` once the
      backend is closed) only when the vector could not be queued at all; then
      ``on_done`` is never called.

    ``name`` is the name the backend is registered under. ``in_flight`` counts
    the vectors submitted and not yet completed (it may drop just before their
    ``on_done`` runs, and is 0 once every ``on_done`` has returned). ``close()``
    waits for every submitted vector's ``on_done``, then releases threads and
    rings; a second ``close`` does nothing, and ``submit`` after it raises
    ``RuntimeError``.

    Thread safety: ``submit``, ``in_flight`` and ``close`` may be called from
    any thread, concurrently; ``on_done`` callbacks of different vectors may run
    concurrently.
    """

    name: str

    def submit(self, requests: np.ndarray, results: np.ndarray, on_done: Callable[[], None]) -> None: ...

    @property
    def in_flight(self) -> int: ...

    def close(self) -> None: ...


#: Starts a backend: called with the engine's ``threads``, ``queue_depth`` and ``rings`` settings
#: (each backend uses those that apply to it). Raises OSError when the backend cannot start here.
BackendFactory = Callable[..., Backend]


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """One registered backend."""

    name: str
    start: BackendFactory
    #: None when the backend can start here, else why not (checked before ``start`` is tried)
    unavailable: Callable[[], str | None]
    #: ``auto`` tries backends in ascending ``order``
    order: int
    #: caps the bytes one read/write syscall may move (0: no cap); returns the previous cap (tests only)
    set_syscall_limit: Callable[[int], int] | None = None


_registry: dict[str, BackendEntry] = {}
_registry_lock = threading.Lock()


def register_backend(name: str, start: BackendFactory, *, order: int,
                     unavailable: Callable[[], str | None] | None = None,
                     set_syscall_limit: Callable[[int], int] | None = None) -> None:
    """Make ``IOEngine(backend=name)`` start ``start(threads=..., queue_depth=..., rings=...)``.

    ``order`` places it in the sequence ``backend="auto"`` tries (built-ins: io_uring 10,
    threads 20, python 30; python always starts, so a backend meant to be chosen by
    ``auto`` needs an order below 30). ``unavailable()`` says why the backend cannot
    start on this machine (None: it can); it should be cheap and must not raise.
    """
    if not name or name == "auto":
        raise ValueError(f"name: a backend cannot be called {name!r}")
    with _registry_lock:
        if name in _registry:
            raise ValueError(f"name: a backend called {name!r} is already registered")
        _registry[name] = BackendEntry(name, start, unavailable or (lambda: None), order, set_syscall_limit)


def unregister_backend(name: str) -> None:
    """Forget backend ``name`` (engines already running on it keep it)."""
    with _registry_lock:
        if _registry.pop(name, None) is None:
            raise ValueError(f"name: no backend called {name!r} is registered")


def backend_names() -> tuple[str, ...]:
    """Registered backends, in the order ``auto`` tries them."""
    with _registry_lock:
        return tuple(e.name for e in sorted(_registry.values(), key=lambda e: e.order))


def backend_unavailable_reason(name: str) -> str | None:
    """None when backend ``name`` can start here, else why not."""
    return _entry(name).unavailable()


def start_backend(name: str, *, threads: int, queue_depth: int, rings: int) -> tuple[Backend, str]:
    """Start backend ``name`` ("auto": the first in order that starts). Returns it and why it was chosen.

    The reason is "selected" for a named backend, or "auto chose NAME" followed by each
    backend skipped before it and why. A named backend that cannot start raises
    RuntimeError with the reason; ``auto`` raises only if none starts.
    """
    order = list(backend_names()) if name == "auto" else [_entry(name).name]
    skipped: list[str] = []
    for candidate in order:
        entry = _entry(candidate)
        reason = entry.unavailable()
        if reason is None:
            try:
                backend = entry.start(threads=threads, queue_depth=queue_depth, rings=rings)
            except OSError as exc:
                reason = str(exc)
            else:
                if name != "auto":
                    return backend, "selected"
                why = _auto_reason(candidate, skipped)
                if candidate == "python" and _native.load_error() is not None:
                    _say_once(f"terastack I/O: {why}. The Python backend costs several times the CPU per "
                              "request of the native ones; every figure measured with it is terastack's slow path.")
                return backend, why
        if name != "auto":
            raise RuntimeError(f"I/O backend {candidate!r} is not available here: {reason}")
        skipped.append(f"{candidate} unavailable: {reason}")
    raise RuntimeError("no I/O backend could start here: " + "; ".join(skipped))


def auto_choice() -> tuple[str, str]:
    """The backend ``auto`` starts in this install, and why, without starting one (benchmarks record it: a
    checkout without the native core's build measures the Python backend)."""
    skipped = []
    for candidate in backend_names():
        reason = _entry(candidate).unavailable()
        if reason is None:
            return candidate, _auto_reason(candidate, skipped)
        skipped.append(f"{candidate} unavailable: {reason}")
    return "none", "; ".join(skipped)


def _auto_reason(candidate: str, skipped: list[str]) -> str:
    return "auto chose " + candidate + (" (" + "; ".join(skipped) + ")" if skipped else "")


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(message, file=sys.stderr, flush=True)


def set_syscall_limit(limit: int) -> int:
    """Cap the bytes one read/write syscall may move in every backend (0: no cap); returns the previous cap
    (the smallest over the backends; ``1 << 30`` when there was none).

    Tests use it to drive every transfer through the short-transfer retry path.
    """
    with _registry_lock:
        hooks = [e.set_syscall_limit for e in _registry.values() if e.set_syscall_limit is not None]
    previous = [hook(limit) for hook in dict.fromkeys(hooks)]  # a hook shared by two backends runs once
    return min(previous, default=0)


def _entry(name: str) -> BackendEntry:
    with _registry_lock:
        entry = _registry.get(name)
    if entry is None:
        raise ValueError(f"backend: must be one of {', '.join(('auto',) + backend_names())}; got {name!r}")
    return entry


# ------------------------------------------------------------------ built-ins
def _native_unavailable(kind: str) -> Callable[[], str | None]:
    def unavailable() -> str | None:
        reason = _native.load_error()
        if reason is None and kind == "io_uring":
            reason = _native.uring_unavailable_reason()
        return reason
    return unavailable


def _native_factory(kind: str) -> BackendFactory:
    def start(*, threads: int, queue_depth: int, rings: int) -> Backend:
        rings = rings or max(1, min(4, os.cpu_count() or 1))  # 0: one ring per core, at most 4
        return _native.NativeBackend(kind, threads=threads, queue_depth=queue_depth, rings=rings)
    return start


def _start_python(*, threads: int, queue_depth: int, rings: int) -> Backend:
    return _python_backend.PythonBackend(threads=threads)


register_backend("io_uring", _native_factory("io_uring"), order=10, unavailable=_native_unavailable("io_uring"),
                 set_syscall_limit=_native.set_syscall_limit)
register_backend("threads", _native_factory("threads"), order=20, unavailable=_native_unavailable("threads"),
                 set_syscall_limit=_native.set_syscall_limit)
register_backend("python", _start_python, order=30, set_syscall_limit=_python_backend.set_syscall_limit)


def backend_record() -> dict:
    """The backend ``backend="auto"`` chooses on this machine and why, for a benchmark's record."""
    return dict(zip(("name", "why"), auto_choice()))
