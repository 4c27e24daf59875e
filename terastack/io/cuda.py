"""Device tensors: staged through pinned host memory, copied on a side stream.

Only used when CUDA is present. A read lands in a pinned bounce buffer, then a
non-blocking host-to-device copy runs on a side stream so the compute stream
is not serialized behind it; the future completes once that copy's event has
fired. A write copies device-to-host on the side stream (after the work already
queued on the tensor's current stream) and then writes the bounce buffer.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from terastack.io.storage_errors import InvalidRequestError
from terastack.io.futures import Future
from terastack.io.requests import OP_READ, op_name

_streams: dict = {}
_lock = threading.Lock()
_event_waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terastack-cuda-events")


def side_stream(device):
    import torch

    with _lock:
        stream = _streams.get(device)
        if stream is None:
            stream = _streams[device] = torch.cuda.Stream(device=device)
        return stream


def staged_transfer(file, op: int, tensor, offset: int, length: int | None) -> Future:
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
    device_bytes = tensor.reshape(-1).view(torch.uint8)[:length]
    staging = torch.empty(length, dtype=torch.uint8, pin_memory=True)
    stream = side_stream(tensor.device)
    out = Future()

    def fail(exc: BaseException) -> None:
        out.set_exception(exc)

    if op == OP_READ:
        def copy_up(done) -> None:
            try:
                done.result()
                with torch.cuda.stream(stream):
                    device_bytes.copy_(staging, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
                _event_waiter.submit(lambda: (event.synchronize(), out.set_result(length)))
            except BaseException as exc:  # noqa: BLE001
                fail(exc)

        file.pread(staging, offset, length).add_done_callback(copy_up)
    else:
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            staging.copy_(device_bytes, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)

        def write_down() -> None:
            try:
                event.synchronize()
                file.pwrite(staging, offset, length).add_done_callback(
                    lambda done: fail(done.exception()) if done.exception() else out.set_result(done.result()))
            except BaseException as exc:  # noqa: BLE001
                fail(exc)

        _event_waiter.submit(write_down)
    return out
