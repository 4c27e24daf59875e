"""Futures returned by the storage engine.

They are ``concurrent.futures.Future`` objects (``result(timeout)``, ``done()``,
``add_done_callback``) that can also be awaited from asyncio; a request satisfied at once
returns a :class:`Done`, which reads the same way.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, Iterable


class Future(concurrent.futures.Future):
    def __await__(self):
        return asyncio.wrap_future(self).__await__()

    def then(self, fn: Callable[[Any], Any]) -> "Future":
        """A future of ``fn(result)``; exceptions of either step propagate to it."""
        out = Future()

        def _chain(done: concurrent.futures.Future) -> None:
            try:
                out.set_result(fn(done.result()))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter, not swallowed
                out.set_exception(exc)

        self.add_done_callback(_chain)
        return out


class Done:
    """A future that is born finished with ``value``: what a request already satisfied returns.

    The storage engine answers most requests of a run whose data is in memory at once (a tensor already
    resident), a thousand or more per training step; a ``concurrent.futures.Future`` builds a condition
    variable and notifies it for each, and that Python cost showed up in the step time. This one holds the
    value and offers the same reading interface (``result``, ``exception``, ``done``, ``add_done_callback``,
    ``then``, ``await``)."""

    __slots__ = ("_value",)

    def __init__(self, value: Any = None):
        self._value = value

    def result(self, timeout: float | None = None) -> Any:
        return self._value

    def exception(self, timeout: float | None = None) -> None:
        return None

    def done(self) -> bool:
        return True

    def running(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def add_done_callback(self, fn: Callable[[Any], Any]) -> None:
        fn(self)  # as concurrent.futures does for a finished future: at once, on the caller's thread

    def then(self, fn: Callable[[Any], Any]) -> "Future | Done":
        try:
            return Done(fn(self._value))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, as Future.then does
            return failed(exc)

    def __await__(self):
        return self._value
        yield  # a generator: awaiting a finished future does not suspend


def completed(value: Any = None) -> Done:
    """A finished future of ``value``."""
    return Done(value)


def failed(exc: BaseException) -> Future:
    fut = Future()
    fut.set_exception(exc)
    return fut


def gather(futures: Iterable[concurrent.futures.Future]) -> Future:
    """One future for many: its result is the list of their results, its error the first error."""
    futures = list(futures)
    out = Future()
    if not futures:
        out.set_result([])
        return out
    remaining = [len(futures)]
    import threading

    lock = threading.Lock()

    def _one_done(_: concurrent.futures.Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if not last:
            return
        try:
            out.set_result([f.result() for f in futures])
        except BaseException as exc:  # noqa: BLE001
            out.set_exception(exc)

    for f in futures:
        f.add_done_callback(_one_done)
    return out


def wait_all(futures: Iterable[concurrent.futures.Future], timeout: float | None = None) -> list:
    return gather(futures).result(timeout)
