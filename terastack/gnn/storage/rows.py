"""Reading arbitrary feature rows from SSD: whole 4 KiB blocks, one batched request per call.

[Note: row reads are block reads]
A feature row (e.g. 128 fp32 = 512 bytes) is smaller than the 4 KiB unit
O_DIRECT works in, and rows start at arbitrary offsets. So a set of rows is
read as the set of 4 KiB blocks that cover them: for every row, the blocks from
``floor(start / BLOCK)`` to ``floor((end - 1) / BLOCK)``; their union, sorted,
with runs of consecutive blocks merged into one extent. All extents go to the
storage engine in ONE ``File.pread_many`` call into a page-aligned buffer,
packed in block order, so every request is O_DIRECT (the engine serves only a
file's unaligned last block through the page cache). A row then sits at
``(index of its first block in the packed buffer) * BLOCK + start % BLOCK``,
contiguous even when it straddles two blocks (both were read, adjacently).
Rows are cut out of the buffer with one ``index_select`` over a strided view
(``unfold``) of it: no Python loop per row or per block.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from terastack import io
from terastack.constants import BLOCK


@dataclass(slots=True)
class RowRequest:
    """A block read in flight for a set of rows."""

    future: io.Future
    buffer: np.ndarray      # packed blocks (page-aligned)
    elem_start: np.ndarray  # per row: element offset of the row in `buffer`
    blocks: int
    extents: int
    nbytes: int
    #: seconds :meth:`RowReader.finish` waited for the reads
    waited: float = 0.0


class Staging:
    """A grow-only, page-aligned buffer that block reads are packed into (one per reader, or one per thread
    that reads through a shared reader: a buffer must not be shared by two reads in flight)."""

    __slots__ = ("buffer",)

    def __init__(self):
        self.buffer = np.zeros(0, np.uint8)

    def ensure(self, nbytes: int) -> np.ndarray:
        # bounded by the largest read seen (reported as `staging_bytes`)
        if self.buffer.nbytes < nbytes:
            self.buffer = io.aligned_empty(int(nbytes * 1.25) // BLOCK * BLOCK + BLOCK)
        return self.buffer

    def release(self) -> None:
        self.buffer = np.zeros(0, np.uint8)


def block_period_rows(row_bytes: int) -> int:
    """Rows in the shortest run of rows that ends on a block boundary: a chunk of a multiple of this many
    rows starts and ends block aligned (what O_DIRECT needs)."""
    return BLOCK // int(np.gcd(row_bytes, BLOCK))


def covering_blocks(rows: np.ndarray, row_bytes: int, block: int = BLOCK) -> np.ndarray:
    """Sorted unique numbers of the ``block``-byte blocks that hold rows ``rows`` of ``row_bytes`` each."""
    start = np.asarray(rows, dtype=np.int64) * row_bytes
    first = start // block
    last = (start + row_bytes - 1) // block
    span = last - first + 1
    if (span == 1).all():
        return np.unique(first)
    rep = np.repeat(np.arange(len(start)), span)
    within = np.arange(len(rep)) - np.repeat(np.cumsum(span) - span, span)
    return np.unique(first[rep] + within)


class RowReader:
    """Reads rows of a row-major ``[num_rows, row_len]`` matrix file through the storage engine."""

    def __init__(self, path: str | os.PathLike, *, num_rows: int, row_len: int, dtype, direct: bool | str = "auto",
                 engine=None):
        self.path = os.fspath(path)
        self.num_rows, self.row_len = num_rows, row_len
        self.dtype = np.dtype(dtype)
        self.torch_dtype = torch.from_numpy(np.zeros(0, self.dtype)).dtype
        self.row_bytes = row_len * self.dtype.itemsize
        self.file = io.open(self.path, "r", direct=direct, engine=engine)
        self.file_size = self.file.size
        if self.file_size != num_rows * self.row_bytes:
            raise ValueError(f"{self.path}: {self.file_size} bytes, expected {num_rows} rows x {self.row_bytes} bytes")
        self._staging = Staging()

    @property
    def direct(self) -> bool:
        return self.file.direct

    @property
    def direct_reason(self) -> str:
        return "O_DIRECT" if self.file.direct else (self.file.direct_reason or "buffered")

    def blocks_for(self, rows: np.ndarray) -> np.ndarray:
        """Sorted unique block numbers covering ``rows``."""
        return covering_blocks(rows, self.row_bytes)

    def release_staging(self) -> None:
        """Drop the staging buffer (after a one-off large read, so it is not kept for the rest of the run)."""
        self._staging.release()

    @property
    def staging_bytes(self) -> int:
        return self._staging.buffer.nbytes

    def submit(self, rows: np.ndarray, *, buffer: np.ndarray | None = None,
               staging: Staging | None = None) -> RowRequest:
        """Start reading ``rows`` (global row ids); one ``pread_many`` call. See [Note: row reads are block reads].

        The blocks land in ``buffer`` if given, else in ``staging`` (default: this reader's own; a thread
        reading beside others through the same reader passes its own)."""
        rows = np.asarray(rows, dtype=np.int64)
        blocks = self.blocks_for(rows)
        nb = len(blocks)
        buf = buffer if buffer is not None else (staging or self._staging).ensure(nb * BLOCK)
        if nb == 0:
            return RowRequest(io.completed(np.zeros(0, np.int64)), buf, np.zeros(0, np.int64), 0, 0, 0)
        # runs of consecutive blocks -> one extent each
        breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
        run_first = np.concatenate([[0], breaks])
        run_len = np.diff(np.concatenate([run_first, [nb]]))
        offsets = blocks[run_first] * BLOCK
        lengths = np.minimum(run_len * BLOCK, self.file_size - offsets)  # the file's last block may be partial
        future = self.file.pread_many(buf, offsets, lengths, run_first * BLOCK)
        start = rows * self.row_bytes
        slot = np.searchsorted(blocks, start // BLOCK)
        elem_start = (slot * BLOCK + start % BLOCK) // self.dtype.itemsize
        return RowRequest(future, buf, elem_start, nb, len(offsets), int(lengths.sum()))

    def finish(self, request: RowRequest, out: torch.Tensor, positions: torch.Tensor | None = None,
               *, timeout: float = 300.0) -> None:
        """Wait for ``request`` and write its rows into ``out`` (at ``positions``, or rows 0..n-1)."""
        waited = time.perf_counter()
        request.future.result(timeout=timeout)
        request.waited = time.perf_counter() - waited
        n = len(request.elem_start)
        if n == 0:
            return
        flat = torch.from_numpy(request.buffer[: request.blocks * BLOCK].view(self.dtype))
        rows = flat.unfold(0, self.row_len, 1).index_select(0, torch.from_numpy(request.elem_start))
        if positions is None:
            out[:n].copy_(rows)
        else:
            out.index_copy_(0, positions, rows)

    def read(self, rows: np.ndarray) -> torch.Tensor:
        """Blocking: the rows as a new ``[len(rows), row_len]`` tensor."""
        out = torch.empty(len(rows), self.row_len, dtype=self.torch_dtype)
        self.finish(self.submit(rows), out)
        return out

    def scan(self, chunk_bytes: int = 32 << 20):
        """Yield ``(first_row, rows_tensor)`` over the whole file in large sequential O_DIRECT reads (double-buffered)."""
        rows_per_chunk = max(1, chunk_bytes // self.row_bytes)
        # Chunk starts must stay block aligned: use a multiple of the rows per whole number of blocks.
        period = block_period_rows(self.row_bytes)
        rows_per_chunk = max(period, rows_per_chunk // period * period)
        bufs = [io.aligned_empty((rows_per_chunk, self.row_len), self.dtype) for _ in range(2)]
        starts = list(range(0, self.num_rows, rows_per_chunk))
        if not starts:
            return

        def issue(k: int):
            s = starts[k]
            count = min(rows_per_chunk, self.num_rows - s)
            return self.file.pread(bufs[k % 2], s * self.row_bytes, count * self.row_bytes), count

        pending = issue(0)
        for k, s in enumerate(starts):
            future, count = pending
            future.result(timeout=300)
            if k + 1 < len(starts):
                pending = issue(k + 1)
            yield s, torch.from_numpy(bufs[k % 2][:count])

    def drop_cache(self) -> None:
        self.file.drop_cache()

    def close(self) -> None:
        self.file.close()
