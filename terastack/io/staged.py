"""Staged transfers between a file and a device tensor: chunk by chunk through the reusable pinned buffers of
:class:`~terastack.io.cuda.PinnedStaging`, each chunk's copy on a side stream ([Note: stream order of staged
transfers] and [Note: pinned staging] in terastack.io.cuda). :func:`chunked_read` and :func:`chunked_write` are
the device-free core (the tests drive them with CPU copies); :func:`staged_transfer` applies them to a CUDA
tensor.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from terastack.io.cuda import DOWN, UP, PinnedStaging, default_staging, side_stream
from terastack.io.futures import Future
from terastack.io.requests import OP_READ, op_name
from terastack.io.storage_errors import InvalidRequestError

# one driver (acquires chunks, issues work) and one waiter (waits on copy events) per direction
_read_driver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-stage-read")
_write_driver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-stage-write")
_read_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-cuda-read-events")
_write_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-cuda-write-events")


class _Countdown:
    """The future of a transfer of several chunks: done when each has finished, failed by the first error."""

    def __init__(self, chunks: int, result):
        self.out = Future()
        self._left = chunks
        self._result = result
        self._lock = threading.Lock()
        if chunks == 0:
            self.out.set_result(result)

    def one_done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last and not self.out.done():
            self.out.set_result(self._result)

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.out.done():
                return
            self.out.set_exception(exc)

    @property
    def failed(self) -> bool:
        return self.out.done() and self.out.exception() is not None


def _spans(length: int, chunk: int):
    return [(start, min(chunk, length - start)) for start in range(0, length, chunk)]


def _drive(spans, staging: PinnedStaging, state: _Countdown, timeout: float | None,
           start_chunk: Callable, next_step: Callable) -> None:
    """Run on a driver thread: for each span, take a staging chunk, start its first step
    (``start_chunk(buf, start, n)``) and hand what that returns to ``next_step(result, buf, start, n)``; stop
    at the first error (the chunk goes back to ``staging``) or once the transfer's future is done."""
    for start, n in spans:
        if state.out.done():
            return
        try:
            buf = staging.acquire(timeout)
        except BaseException as exc:  # noqa: BLE001 - the caller sees it through the future
            state.fail(exc)
            return
        try:
            first = start_chunk(buf, start, n)
        except BaseException as exc:  # noqa: BLE001
            staging.release(buf)
            state.fail(exc)
            return
        next_step(first, buf, start, n)


def chunked_read(read_chunk: Callable, copy_up: Callable, staging: PinnedStaging, length: int,
                 *, timeout: float | None = 600.0) -> Future:
    """Read ``length`` bytes chunk by chunk through ``staging``; the future's result is ``length``.

    ``read_chunk(buf, start, n)``: a future of the file's bytes [start, start+n) of the transfer read into
    ``buf[:n]``. ``copy_up(buf, start, n)``: queues the copy of ``buf[:n]`` to the destination at ``start`` and
    returns a callable that blocks until that copy has completed (raising if it failed); the chunk goes back to
    ``staging`` after it returns."""
    spans = _spans(length, staging.chunk)
    state = _Countdown(len(spans), length)

    def finish(wait, buf) -> None:
        try:
            wait()
            state.one_done()
        except BaseException as exc:  # noqa: BLE001 - the caller sees it through the future
            state.fail(exc)
        finally:
            staging.release(buf)

    def landed(done, buf, start: int, n: int) -> None:
        try:
            done.result()
            if state.failed:
                staging.release(buf)
                return
            wait = copy_up(buf, start, n)
        except BaseException as exc:  # noqa: BLE001
            staging.release(buf)
            state.fail(exc)
            return
        _read_waiter.submit(finish, wait, buf)

    def next_step(fut, buf, start: int, n: int) -> None:
        fut.add_done_callback(lambda done: landed(done, buf, start, n))

    if spans:
        _read_driver.submit(_drive, spans, staging, state, timeout, read_chunk, next_step)
    return state.out


def chunked_write(copy_down: Callable, write_chunk: Callable, staging: PinnedStaging, length: int,
                  *, timeout: float | None = 600.0) -> Future:
    """Write ``length`` bytes chunk by chunk through ``staging``; the future's result is ``length``.

    ``copy_down(buf, start, n)``: queues the copy of the source's bytes [start, start+n) into ``buf[:n]`` and
    returns a callable that blocks until it has completed. ``write_chunk(buf, start, n)``: a future of the
    write of ``buf[:n]`` to the file at the transfer's ``start``."""
    spans = _spans(length, staging.chunk)
    state = _Countdown(len(spans), length)

    def written(done, buf) -> None:
        staging.release(buf)
        exc = done.exception()
        if exc is not None:
            state.fail(exc)
        else:
            state.one_done()

    def copied(wait, buf, start: int, n: int) -> None:
        try:
            wait()
            if state.failed:
                staging.release(buf)
                return
            fut = write_chunk(buf, start, n)
        except BaseException as exc:  # noqa: BLE001
            staging.release(buf)
            state.fail(exc)
            return
        fut.add_done_callback(lambda done: written(done, buf))

    def next_step(wait, buf, start: int, n: int) -> None:
        _write_waiter.submit(copied, wait, buf, start, n)

    if spans:
        _write_driver.submit(_drive, spans, staging, state, timeout, copy_down, next_step)
    return state.out


def staged_transfer(file, op: int, tensor, offset: int, length: int | None, *,
                    staging: PinnedStaging | None = None) -> Future:
    """Read into / write from device ``tensor`` through ``staging`` (the shared default when None), in the
    stream order of [Note: stream order of staged transfers]."""
    import torch

    what = op_name(op)
    if not tensor.is_contiguous():
        raise InvalidRequestError(what, path=file.path, offset=offset, length=length,
                                  detail="device tensor is not contiguous")
    nbytes = tensor.numel() * tensor.element_size()
    length = nbytes if length is None else length
    if length > nbytes:
        raise InvalidRequestError(what, path=file.path, offset=offset, length=length,
                                  detail=f"buffer too small: holds {nbytes} bytes, request needs {length}")
    staging = staging or default_staging()
    device_bytes = tensor.reshape(-1).view(torch.uint8)[:length]
    stream = side_stream(tensor.device, UP if op == OP_READ else DOWN)
    consumer = torch.cuda.current_stream(tensor.device)
    # the allocator may reuse the block once its owner frees it: not before the side stream is done with it
    device_bytes.record_stream(stream)

    def synced(event):
        return event.synchronize

    if op == OP_READ:
        ready = torch.cuda.Event()
        ready.record(consumer)  # the work queued so far may still use the destination's block

        def copy_up(buf, start: int, n: int):
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                device_bytes[start:start + n].copy_(buf[:n], non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            return synced(event)

        return chunked_read(lambda buf, start, n: file.pread(buf, offset + start, n), copy_up, staging, length)

    stream.wait_stream(consumer)  # the values are those the work queued so far produces

    def copy_down(buf, start: int, n: int):
        with torch.cuda.stream(stream):
            buf[:n].copy_(device_bytes[start:start + n], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return synced(event)

    return chunked_write(copy_down, lambda buf, start, n: file.pwrite(buf, offset + start, n), staging, length)
