"""terastack.io: the asynchronous, batched storage engine.

    from terastack import io
    with io.open("/data/x.bin", "r") as f:
        fut = f.pread(buf, 0)          # Future[int], awaitable
        n = f.read(buf, 0)             # blocking form
        sizes = f.pread_many(buf, offsets, lengths).result()   # one call, many extents

The engine behind ``io.open`` is :func:`get_engine` (backend chosen by
``TERASTACK_IO_BACKEND`` or "auto"); make your own with :class:`IOEngine`.
Backends implement :class:`Backend` and are registered by name with
:func:`register_backend` (:mod:`terastack.io.backend`).
"""
from terastack.io.backend import Backend, backend_names, register_backend
from terastack.io.buffers import AlignedArena, ArenaBuffer, aligned_empty, view_buffer
from terastack.io.engine import IOEngine, IOStats, get_engine, set_engine
from terastack.errors import BudgetError  # shared by every layer; also offered here, beside the I/O errors
from terastack.io.storage_errors import BatchError, ClosedFileError, EndOfFileError, InvalidRequestError, StorageError
from terastack.io.file import File, open
from terastack.io.futures import Future, completed, gather, wait_all

__all__ = [
    "AlignedArena", "ArenaBuffer", "Backend", "BatchError", "BudgetError", "ClosedFileError", "EndOfFileError",
    "File", "Future", "IOEngine", "IOStats", "InvalidRequestError", "StorageError", "aligned_empty",
    "backend_names", "completed", "gather", "get_engine", "open", "register_backend", "set_engine",
    "view_buffer", "wait_all",
]
