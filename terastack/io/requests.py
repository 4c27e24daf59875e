"""The request vector every backend takes, and how the engine plans one and reads its results.

A request vector is a numpy array of :data:`REQUEST_DTYPE`, one entry per
transfer: ``op`` (:data:`OP_READ` or :data:`OP_WRITE`), ``fd``, ``offset``,
``length`` and ``addr`` (the buffer's address). Its outcome is an int64 array
of the same length: bytes moved, or ``-errno`` (see
:class:`terastack.io.backend.Backend` for the full contract). The native core
(``csrc/tsio.c``, ``struct ts_request``) reads the same layout.

This module imports nothing from the backends, so that every backend and the
engine share one definition of the format without importing each other.

[Note: request planning]
Before submission every request is planned into pieces, vectorized:
  * on a file opened with O_DIRECT, a request whose buffer address and file
    offset agree modulo 4 KiB sends its aligned middle through the O_DIRECT
    descriptor and its unaligned head and tail (if any) through the buffered
    descriptor of the same file; a request whose address and offset disagree
    goes whole through the buffered descriptor. Unaligned requests are thus
    served, never refused, and aligned ones (use an AlignedArena) stay direct.
    Linux flushes dirty page-cache pages before an O_DIRECT read of the same
    range and invalidates them after an O_DIRECT write, so the two paths agree.
  * a piece longer than ``split_bytes`` is cut into pieces of that size, so a
    single large transfer uses the whole queue depth.
Pieces of one request stay adjacent, so per-request results are sums over
contiguous runs (``np.add.reduceat``, :func:`per_request_results`).
"""
from __future__ import annotations

import numpy as np

from terastack.constants import DIRECT_ALIGN, round_up

#: One request as the backends read it (struct ts_request in csrc/tsio.c).
REQUEST_DTYPE = np.dtype([("op", "<i4"), ("fd", "<i4"), ("offset", "<i8"), ("length", "<i8"),
                          ("addr", "<u8")])
OP_READ = 0
OP_WRITE = 1


def op_name(op: int) -> str:
    """"read" or "write": the verb errors and traces use for ``op``."""
    return "read" if op == OP_READ else "write"


def plan_requests(op: int, fd_buffered: np.ndarray, fd_direct: np.ndarray, addrs: np.ndarray,
                  offsets: np.ndarray, lengths: np.ndarray, split_bytes: int):
    """Requests for a backend and, per piece, the index of the request it belongs to.

    ``fd_direct[i]`` is -1 where request i's file has no O_DIRECT descriptor.
    See [Note: request planning].
    """
    n = len(offsets)
    offsets = offsets.astype(np.int64, copy=False)
    lengths = lengths.astype(np.int64, copy=False)
    parent = np.arange(n, dtype=np.int64)
    fds = fd_buffered
    whole_direct = ((fd_direct >= 0).all() and (lengths > 0).all()
                    and not ((offsets | lengths | addrs.astype(np.int64)) % DIRECT_ALIGN).any())
    if whole_direct:
        fds = fd_direct  # every request aligned (the common case): no buffered head or tail pieces to split off
    elif (fd_direct >= 0).any():
        ends = offsets + lengths
        start_al = round_up(offsets, DIRECT_ALIGN)
        end_al = ends // DIRECT_ALIGN * DIRECT_ALIGN
        congruent = (addrs.astype(np.int64) - offsets) % DIRECT_ALIGN == 0
        split = (fd_direct >= 0) & (end_al > start_al) & congruent
        zero = np.zeros(n, dtype=np.int64)
        piece_off = np.stack([offsets, np.where(split, start_al, 0), np.where(split, end_al, 0)], axis=1)
        piece_len = np.stack([np.where(split, start_al - offsets, lengths),
                              np.where(split, end_al - start_al, zero),
                              np.where(split, ends - end_al, zero)], axis=1)
        piece_fd = np.stack([fd_buffered, np.where(split, fd_direct, fd_buffered), fd_buffered], axis=1)
        keep = piece_len > 0
        keep[:, 0] |= ~keep.any(axis=1)  # a zero-length request still gets its (empty) piece
        keep = keep.ravel()
        parent = np.repeat(parent, 3)[keep]
        offsets_p = piece_off.ravel()[keep]
        addrs = (addrs[parent].astype(np.int64) + (offsets_p - offsets[parent])).astype(np.uint64)
        offsets, lengths, fds = offsets_p, piece_len.ravel()[keep], piece_fd.ravel()[keep]
    if (lengths > split_bytes).any():
        pieces = np.maximum(1, -(-lengths // split_bytes))
        owner = np.repeat(np.arange(len(lengths)), pieces)
        k = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        step = k * split_bytes
        offsets, addrs = offsets[owner] + step, addrs[owner] + step.astype(np.uint64)
        lengths = np.minimum(split_bytes, lengths[owner] - step)
        fds, parent = fds[owner], parent[owner]
    requests = np.empty(len(offsets), dtype=REQUEST_DTYPE)
    requests["op"] = op
    requests["fd"] = fds
    requests["offset"] = offsets
    requests["length"] = lengths
    requests["addr"] = addrs
    return requests, parent


def per_request_results(results: np.ndarray, parent: np.ndarray, n: int) -> np.ndarray:
    """Per-request outcome from per-piece outcomes: bytes summed, or the first failed piece's -errno."""
    if len(results) == n:
        return results.copy()
    starts = np.flatnonzero(np.r_[True, parent[1:] != parent[:-1]])
    bad = results < 0
    totals = np.add.reduceat(np.where(bad, 0, results), starts)
    if bad.any():
        first_bad = np.flatnonzero(bad)
        owners, where = np.unique(parent[first_bad], return_index=True)
        totals[owners] = results[first_bad[where]]
    return totals
