"""A CSC ``indptr`` held in memory in about 2.1 bytes per entry instead of 8, read like an int64 array.

[Note: the compact indptr]
The in-memory ``indptr`` of a topology on the SSD (terastack.gnn.storage.topology [Note: topology on the SSD]) is
consulted once per uncached frontier node, and when it does not fit in memory each of those lookups costs a
4 KiB block read. Its 8 bytes per entry are mostly zeros: consecutive entries differ by one node's in-degree.
:class:`CompactIndptr` keeps the same values in groups of ``G`` = 64 entries:

    base[g]      int64 per group: indptr[g * G]                      (8 / G bytes per entry)
    local[i]     uint16 per entry: indptr[i] - base[i // G]          (2 bytes per entry)

which holds whenever a group's entries lie in ``base[g] .. base[g] + 65535`` (64 nodes with fewer than 65536
in-edges between them). A group that does not ("wide": it holds a hub, or the file is not a valid indptr)
keeps its G entries in a row of their own, found without a search: its ``base`` holds ``-1 - row`` (a valid
base is never negative), and the row is ``wide_base[row] + wide_off[row]`` (``wide_off`` uint32 when every
wide row spans less than 2**32 and starts at >= 0, else int64 values with ``wide_base`` 0). A read of any
entry is then O(1): two gathers (``base``, ``local``), plus a third for the few entries in wide groups.

Wide groups are few in a valid indptr: group spans are disjoint pieces of ``0..num_edges``, so at most
``num_edges // 65536`` of them exceed 65535, which bounds the memory before anything is read
(:func:`compact_indptr_bytes`, what the ``indptr="auto"`` rules weigh against the budget). Any int64 sequence
is kept exactly (a corrupt file is encoded faithfully, so the dataset's checks still name its defect), only
less compactly.

The build streams its source in chunks of a multiple of ``G`` entries (an ndarray, a memmap, or anything with
``read_range(lo, hi)`` such as terastack.gnn.storage.topology.DiskArray): the int64 array is never held whole.
"""
from __future__ import annotations

import numpy as np

#: entries per group: a power of two, so group and position in it are a shift and a mask
GROUP = 64
#: the largest offset a ``local`` entry holds
_LOCAL_MAX = np.iinfo(np.uint16).max
#: source entries read per step of the build (a multiple of any power-of-two group up to 2**16)
_BUILD_CHUNK = 1 << 21


def compact_indptr_bytes(num_nodes: int, num_edges: int, group: int = GROUP) -> int:
    """Bytes a :class:`CompactIndptr` of a valid indptr of ``num_nodes + 1`` entries over ``num_edges`` edges
    holds at most (see [Note: the compact indptr]): known before it is built."""
    n = num_nodes + 1
    groups = -(-n // group)
    wide = min(groups, max(num_edges, 0) // (_LOCAL_MAX + 1))
    wide_item = 4 if num_edges < (1 << 32) else 8
    return 2 * n + 8 * groups + wide * (group * wide_item + 8)


class CompactIndptr:
    """An int64 ``indptr`` in about 2.1 bytes per entry; see [Note: the compact indptr].

    Reads like the int64 array it encodes: ``len``, ``shape``, ``dtype``, ``a[i]`` (negative too),
    ``a[lo:hi]`` and ``a[int_array]`` (int64 ndarrays) and ``np.asarray(a)``; ``nbytes`` is the memory held.
    Built from ``source`` (an ndarray, a memmap, or anything with ``len`` and ``read_range(lo, hi)``) in
    sequential reads of ``chunk`` entries.
    """

    dtype = np.dtype(np.int64)
    ndim = 1

    def __init__(self, source, *, group: int = GROUP, chunk: int = _BUILD_CHUNK):
        if group < 1 or group & (group - 1) or group > (1 << 16):
            raise ValueError(f"group: must be a power of two from 1 to 65536, got {group}")
        self.group = group
        self._shift = group.bit_length() - 1
        self._mask = group - 1
        n = self.length = len(source)
        groups = -(-n // group)
        self.base = np.empty(groups, np.int64)
        self.local = np.zeros(n, np.uint16)
        read = getattr(source, "read_range", None)
        step = max(group, chunk // group * group)
        wide_rows: list[np.ndarray] = []
        rows = 0
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            vals = np.asarray(read(lo, hi) if read is not None else source[lo:hi], dtype=np.int64)
            if len(vals) != hi - lo:
                raise ValueError(f"source: read {len(vals)} entries at {lo}, expected {hi - lo}")
            # the last group may be partial: pad it with its own last entry (changes neither min nor max)
            block = np.concatenate([vals, np.full(-len(vals) % group, vals[-1])]).reshape(-1, group)
            first, low, high = block[:, 0], block.min(axis=1), block.max(axis=1)
            # first >= 0 and low >= first keep both differences free of int64 overflow
            narrow = (first >= 0) & (low >= first) & (high - first <= _LOCAL_MAX)
            g0 = lo // group
            base = self.base[g0: g0 + len(block)]
            base[:] = first
            offsets = np.where(narrow[:, None], block - first[:, None], 0).astype(np.uint16)
            self.local[lo:hi] = offsets.ravel()[: hi - lo]
            wide = np.flatnonzero(~narrow)
            if len(wide):
                base[wide] = -1 - (rows + np.arange(len(wide)))
                wide_rows.append(block[wide])
                rows += len(wide)
        self.wide_base, self.wide_off = _wide_table(wide_rows, group)

    # ------------------------------------------------------------------ array face
    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    @property
    def size(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        """Memory held: the compact arrays, not the 8 bytes per entry they encode."""
        return self.base.nbytes + self.local.nbytes + self.wide_base.nbytes + self.wide_off.nbytes

    @property
    def wide_groups(self) -> int:
        return len(self.wide_base)

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return (f"CompactIndptr({self.length} entries, {self.nbytes} bytes, {self.wide_groups} wide groups "
                f"of {self.group})")

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.length)
            if step != 1:
                raise IndexError(f"CompactIndptr: only contiguous slices are decoded, got step {step}")
            return self._range(lo, max(lo, hi))
        if isinstance(key, (int, np.integer)):
            i = int(key)
            if not -self.length <= i < self.length:
                raise IndexError(f"CompactIndptr: index {i} out of range for {self.length} entries")
            i += self.length if i < 0 else 0
            b = int(self.base[i >> self._shift])
            return np.int64(b + int(self.local[i]) if b >= 0 else self._wide(b, i))
        return self._take(np.asarray(key))

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("CompactIndptr: np.asarray decodes a new int64 array; a copy cannot be avoided")
        out = self._range(0, self.length)
        return out if dtype is None else out.astype(dtype, copy=False)

    # ------------------------------------------------------------------ decoding
    def _take(self, idx: np.ndarray) -> np.ndarray:
        """Entries at ``idx`` (any shape, negative allowed): the sampler's hot path."""
        if idx.ndim == 0 and idx.dtype.kind in "iu":
            return self[int(idx)]
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                idx = idx.astype(np.int64)
            else:
                raise IndexError(f"CompactIndptr: index arrays must be integers, got {idx.dtype}")
        if idx.size:
            lowest = idx.min()
            if lowest < 0:
                if lowest < -self.length:
                    raise IndexError(f"CompactIndptr: index {int(lowest)} out of range for {self.length} entries")
                idx = np.where(idx < 0, idx + self.length, idx)
        # np.take: a faster gather than fancy indexing; it raises IndexError past the end, before base is read
        local = np.take(self.local, idx)
        b = np.take(self.base, idx >> self._shift)
        return self._with_wide(b + local, b, lambda wide: idx[wide])

    def _range(self, lo: int, hi: int) -> np.ndarray:
        """Entries ``lo..hi-1`` as a new int64 array."""
        if hi <= lo:
            return np.zeros(0, np.int64)
        g0, g1 = lo >> self._shift, ((hi - 1) >> self._shift) + 1
        skip = lo - (g0 << self._shift)
        b = np.repeat(self.base[g0:g1], self.group)[skip: skip + hi - lo]
        return self._with_wide(b + self.local[lo:hi], b, lambda wide: np.flatnonzero(wide) + lo)

    def _with_wide(self, out: np.ndarray, b: np.ndarray, positions) -> np.ndarray:
        """``out`` (decoded as narrow from the groups' bases ``b``) with its entries in wide groups read from
        their rows; ``positions(mask)``: the entry indices of the masked ones."""
        if len(self.wide_base):
            wide = b < 0
            if wide.any():
                out[wide] = self._wide(b[wide], positions(wide))
        return out

    def _wide(self, b, i):
        """Entries ``i`` of wide groups whose ``base`` holds ``b`` (= -1 - their row); scalars or arrays."""
        row = -1 - b
        return self.wide_base[row] + self.wide_off[row, i & self._mask]


def _wide_table(rows: list[np.ndarray], group: int) -> tuple[np.ndarray, np.ndarray]:
    """``(wide_base, wide_off)`` of the wide groups' entries: uint32 offsets from each row's least entry
    when they fit, else the int64 values themselves over a base of 0."""
    if not rows:
        return np.zeros(0, np.int64), np.zeros((0, group), np.uint32)
    values = np.concatenate(rows)
    low, high = values.min(axis=1), values.max(axis=1)
    if (low >= 0).all() and (high - low <= np.iinfo(np.uint32).max).all():
        return low.astype(np.int64), (values - low[:, None]).astype(np.uint32)
    return np.zeros(len(values), np.int64), values
