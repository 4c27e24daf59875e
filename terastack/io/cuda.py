"""Device tensors: staged through reusable pinned host buffers, copied on a side stream.

Only used when CUDA is present. A read lands chunk by chunk in pinned bounce
buffers, and each chunk's non-blocking host-to-device copy runs on a side
stream so the compute stream is not serialized behind it; the future completes
once every chunk's copy event has fired. A write copies device-to-host on the
side stream, chunk by chunk, and writes each bounce buffer.

[Note: stream order of staged transfers]
PyTorch's caching allocator hands a block back out as soon as the CPU frees it,
to the next allocation *on the same stream*: the kernels that used it may still
be queued. Work on that stream is ordered after them; work on our side stream is
not. So:

- a read records an event on the submitting thread's current stream (the
  stream its destination was allocated on) at submission, and the side stream
  waits on that event before copying into the destination: the copy cannot
  overwrite weights or activations that queued kernels still read;
- a write makes the side stream wait for the current stream before copying out
  (the tensor's values are those the queued kernels produce);
- the destination/source records the side stream (``record_stream``), so when
  its owner frees it before our copy ran, the allocator does not reuse the block
  until the side stream has passed that point.

[Note: pinned staging]
Pinned memory is page-locked host memory, and PyTorch's pinned allocator rounds
each request up to a power of two and caches the block: pinning per request
would hold up to twice the bytes, for as long as the process lives. Staging uses
a fixed number of power-of-two chunks (:class:`PinnedStaging`), allocated once
and reused, their bytes reserved in the host ledger when one is given; a record
larger than the cap is staged chunk by chunk, so any record can move through
any cap of at least one chunk, and concurrent transfers wait for a free chunk
instead of failing.

The completion of a chunk is waited on by a waiter thread per direction (reads
never queue behind writes that wait on compute), and an error there fails the
transfer's future instead of leaving its caller waiting.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from terastack.errors import BudgetError
from terastack.io.storage_errors import InvalidRequestError
from terastack.io.futures import Future
from terastack.io.requests import OP_READ, op_name

#: the largest staging chunk: big enough for full PCIe bandwidth, small enough that several are in flight
MAX_CHUNK = 64 << 20
#: the smallest: whole O_DIRECT blocks
MIN_CHUNK = 4096
#: the cap of the staging shared by transfers that bring none of their own
DEFAULT_CAP = 256 << 20

_streams: dict = {}
_lock = threading.Lock()
_default_staging: "PinnedStaging | None" = None
# one driver (acquires chunks, issues work) and one waiter (waits on copy events) per direction
_read_driver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-stage-read")
_write_driver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-stage-write")
_read_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-cuda-read-events")
_write_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-cuda-write-events")


def floor_pow2(n: int) -> int:
    """The largest power of two <= ``n`` (n >= 1)."""
    return 1 << (int(n).bit_length() - 1)


def staging_chunk(cap: int) -> int:
    """The chunk a staging cap of ``cap`` bytes is cut into: a power of two, at most :data:`MAX_CHUNK`, and at
    least two chunks when the cap allows (a chunk's copy overlaps the next chunk's read)."""
    if cap < MIN_CHUNK:
        raise ValueError(f"pinned_budget: at least {MIN_CHUNK} bytes (one staging chunk); got {cap}")
    return max(MIN_CHUNK, min(MAX_CHUNK, floor_pow2(cap // 2 if cap >= 2 * MIN_CHUNK else cap)))


class PinnedStaging:
    """At most ``cap`` bytes of reusable bounce buffers of ``chunk`` bytes each ([Note: pinned staging]).

    ``pin``: page-locked (CUDA) or plain aligned host memory (tests). ``ledger``: a BudgetLedger (the host
    tier's) that each buffer's bytes are reserved in when it is first allocated and released by :meth:`close`.
    """

    def __init__(self, cap: int, *, chunk: int | None = None, pin: bool = True, ledger=None):
        chunk = staging_chunk(cap) if chunk is None else int(chunk)
        if chunk < MIN_CHUNK or chunk & (chunk - 1) or chunk > cap:
            raise ValueError(f"chunk: a power of two in [{MIN_CHUNK}, cap={cap}]; got {chunk}")
        self.cap, self.chunk, self.count = int(cap), chunk, int(cap) // chunk
        self.pin = pin
        self.ledger = ledger
        self._cond = threading.Condition()
        self._idle: list = []
        self._allocated = 0
        self.used = 0
        self.peak = 0

    def acquire(self, timeout: float | None = None):
        """A free chunk buffer (uint8 tensor of ``chunk`` bytes); waits for one when all are in use."""
        with self._cond:
            while True:
                if self._idle:
                    buf = self._idle.pop()
                    break
                if self._allocated < self.count:
                    buf = self._allocate()
                    if buf is not None:
                        break
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"pinned staging: no chunk free within {timeout} s "
                                       f"(all {self._allocated} chunks of {self.chunk} bytes in use)")
            self.used += self.chunk
            self.peak = max(self.peak, self.used)
            return buf

    def _allocate(self):
        """A new chunk buffer (lock held), or None when the ledger has no room but a buffer will come back."""
        if self.ledger is not None:
            try:
                self.ledger.reserve(self.chunk, what="pinned staging chunk")
            except BudgetError:
                if self._allocated:
                    return None  # wait for one of ours
                raise
        try:
            if self.pin:
                import torch

                buf = torch.empty(self.chunk, dtype=torch.uint8, pin_memory=True)
            else:
                import torch

                from terastack.io.buffers import aligned_empty

                buf = aligned_empty(self.chunk, torch.uint8, as_tensor=True)
        except BaseException:
            if self.ledger is not None:
                self.ledger.release(self.chunk)
            raise
        self._allocated += 1
        return buf

    def release(self, buf) -> None:
        with self._cond:
            self.used -= self.chunk
            self._idle.append(buf)
            self._cond.notify()

    @property
    def allocated_bytes(self) -> int:
        with self._cond:
            return self._allocated * self.chunk

    def snapshot(self) -> dict:
        with self._cond:
            return {"limit": self.cap, "used": self.used, "peak": self.peak, "chunk": self.chunk,
                    "allocated": self._allocated * self.chunk}

    def reset_peak(self) -> None:
        with self._cond:
            self.peak = self.used

    def close(self) -> None:
        """Drop the idle buffers and give their bytes back to the ledger (buffers in use are dropped as they
        come back: call once no transfer is in flight)."""
        with self._cond:
            n = len(self._idle)
            self._idle.clear()
            self._allocated -= n
            if self.ledger is not None and n:
                self.ledger.release(n * self.chunk)


def default_staging() -> PinnedStaging:
    """The staging of transfers that bring none of their own (:data:`DEFAULT_CAP`, no ledger)."""
    global _default_staging
    with _lock:
        if _default_staging is None:
            _default_staging = PinnedStaging(DEFAULT_CAP)
        return _default_staging


def side_stream(device):
    import torch

    with _lock:
        stream = _streams.get(device)
        if stream is None:
            stream = _streams[device] = torch.cuda.Stream(device=device)
        return stream


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
    stream = side_stream(tensor.device)
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
