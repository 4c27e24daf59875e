"""Futures returned by the storage engine.

They are ``concurrent.futures.Future`` objects (``result(timeout)``, ``done()``,
``add_done_callback``) that can also be awaited from asyncio.
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


def completed(value: Any) -> Future:
    fut = Future()
    fut.set_result(value)
    return fut


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
