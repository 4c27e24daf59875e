"""Where the sampler's topology comes from: CSC arrays in memory, or the CSC files on SSD with hot lists cached.

The sampler asks a topology two things per hop (see terastack.gnn.sampling.sampler):
``lookup(frontier)`` -- where each frontier node's in-neighbour list starts and
how long it is -- and, after it has drawn positions in those lists,
``neighbours(lookup, owner, positions)`` -- the neighbour ids at those
positions. :class:`ArrayTopology` answers from ``indptr``/``indices`` arrays in
memory (or memory-mapped); :class:`SsdTopology` answers from the files.

[Note: topology on the SSD]
``SsdTopology`` keeps ``indices.bin`` (and, unless it is in memory, ``indptr.bin``)
in their files and reads them through the storage engine as block reads (the
method of terastack.gnn.storage.rows [Note: row reads are block reads], with a row of
one element): the positions a hop needs are mapped to the 4 KiB blocks that
cover them, runs of consecutive blocks become one extent, and every extent of
the hop goes to the engine in ONE ``pread_many``; the values are then sliced
out of the packed block buffer with one vectorized index. Per hop of a batch
that is one submission for the neighbour lists, plus one for the frontier's
``indptr`` entries (``indptr[v]`` and ``indptr[v+1]`` of every uncached node
in the same request) when ``indptr`` is on the SSD.

Only the positions the sampler drew are read, not whole lists: a node with
degree <= fanout keeps its whole list (so all of it is read), a larger one
needs at most ``fanout`` entries, i.e. at most ``fanout`` blocks of a long list.
The random draws depend only on the degrees, never on the values, so the
sampler makes exactly the draws it makes over in-memory arrays and the batches
are identical (same random stream, same neighbour order).

``indptr.bin`` is 8 bytes per node (~0.9 GB for papers100M's 111M nodes); in
memory it is held compact, about 2.1 bytes per node (~0.24 GB for papers100M;
terastack.gnn.storage.compact_indptr [Note: the compact indptr]). It is held in memory
when ``indptr="memory"``, or with ``"auto"`` when the compact form costs at most
a quarter of the topology's memory budget (it then saves one block read per
uncached frontier node; the bound :func:`compact_indptr_bytes` is known before
anything is read), and otherwise read out of core like the lists.

Hot neighbour lists (:class:`HotLists`) are held in memory next to the hot
feature rows; how the one budget is divided between the two is
terastack.gnn.storage.budget_split [Note: splitting one budget between topology and features].
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from terastack.constants import BLOCK
from terastack.counters import Counters
from terastack.gnn.storage.compact_indptr import CompactIndptr, compact_indptr_bytes
from terastack.gnn.storage.rows import RowReader, Staging

#: bytes a cached list costs beyond its entries: its node id, global start, and offset in the packed lists
LIST_OVERHEAD = 24
#: elements per sequential chunk when a whole file is streamed (checks, counts, fills)
_STREAM_ELEMS = 1 << 23
INDPTR_MODES = ("auto", "memory", "ssd")


@dataclass(slots=True)
class HopLookup:
    """Where the lists of one hop's frontier nodes are: ``start``/``deg`` per node; ``slot`` >= 0 if cached."""

    start: np.ndarray
    deg: np.ndarray
    slot: np.ndarray | None = None


@dataclass(slots=True)
class TopologyStats(Counters):
    """Cumulative topology traffic: lists looked up, served from memory, and read from the SSD."""

    lookups: int = 0
    hits: int = 0
    misses: int = 0
    indptr_calls: int = 0
    indices_calls: int = 0
    ssd_bytes: int = 0
    ssd_blocks: int = 0
    def snapshot(self) -> dict:
        with self._lock:
            n = max(self.lookups, 1)
            return {"lookups": self.lookups, "hits": self.hits, "misses": self.misses,
                    "hit_rate": self.hits / n, "indptr_calls": self.indptr_calls,
                    "indices_calls": self.indices_calls, "ssd_bytes": self.ssd_bytes, "ssd_blocks": self.ssd_blocks}


class DiskArray:
    """A read-only 1-D array in a raw little-endian file, read through the storage engine (no mapping).

    Supports ``len``, ``a[i]`` (negative too), ``a[lo:hi]`` (one contiguous read),
    ``a[int_array]``/:meth:`take` (one block read, see [Note: topology on the SSD])
    and ``np.asarray(a)`` (the whole file). Reads never go through the page cache
    when the file system allows O_DIRECT, so they add nothing to the resident set.
    """

    def __init__(self, path: str | os.PathLike, dtype, length: int, *, engine=None, direct: bool | str = "auto"):
        self.path = os.fspath(path)
        self.dtype = np.dtype(dtype)
        self.length = int(length)
        size = os.path.getsize(self.path)
        if size != self.length * self.dtype.itemsize:
            what = "truncated" if size < self.length * self.dtype.itemsize else "longer than expected"
            raise ValueError(f"{self.path}: {size} bytes, expected {self.length} x {self.dtype.name} = "
                               f"{self.length * self.dtype.itemsize} bytes ({what})")
        self.reader = RowReader(self.path, num_rows=self.length, row_len=1, dtype=self.dtype, direct=direct,
                                engine=engine)
        # Several sampler threads read at once (terastack.gnn.sampling.pipeline, ``samplers``): each read takes a staging
        # buffer of its own from this pool and gives it back, so reads overlap instead of queueing on one buffer;
        # the pool holds at most as many buffers as reads were ever in flight together.
        self._lock = threading.Lock()
        self._pool: list[Staging] = []

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    @property
    def nbytes(self) -> int:
        return self.length * self.dtype.itemsize

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.length)
            if step != 1:
                raise IndexError(f"{self.path}: only contiguous slices are read from disk, got step {step}")
            return self.read_range(lo, max(lo, hi))
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.length if key < 0 else 0)
            if not 0 <= i < self.length:
                raise IndexError(f"{self.path}: index {int(key)} out of range for {self.length} elements")
            return self.read_range(i, i + 1)[0]
        return self.take(np.asarray(key, dtype=np.int64))[0]

    def __array__(self, dtype=None, copy=None):
        out = self.read_range(0, self.length)
        return out if dtype is None else out.astype(dtype, copy=False)

    def read_range(self, lo: int, hi: int) -> np.ndarray:
        """Elements ``lo..hi-1``: one read of the blocks covering them."""
        from terastack import io

        s = self.dtype.itemsize
        count = hi - lo
        if count <= 0:
            return np.zeros(0, self.dtype)
        first = lo * s // BLOCK * BLOCK
        end = min(-(-hi * s // BLOCK) * BLOCK, self.nbytes)
        buf = io.aligned_empty(end - first)
        self.reader.file.read(buf, first, end - first, timeout=600)
        head = (lo * s - first) // s
        return buf.view(self.dtype)[head: head + count]  # the buffer is this call's own

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, int, int]:
        """Elements at ``positions`` (any order, repeats allowed) in ONE engine submission.

        Returns ``(values, bytes read, blocks read)``.
        """
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return np.zeros(0, self.dtype), 0, 0
        with self._lock:
            staging = self._pool.pop() if self._pool else Staging()
        try:
            request = self.reader.submit(positions, staging=staging)
            request.future.result(timeout=600)
            values = request.buffer[: request.blocks * BLOCK].view(self.dtype)[request.elem_start]  # a copy
        finally:
            with self._lock:
                self._pool.append(staging)
        return values, request.nbytes, request.blocks

    def chunks(self, chunk: int = _STREAM_ELEMS):
        """Yield ``(first, values)`` over the whole array in sequential reads of ``chunk`` elements."""
        for lo in range(0, self.length, chunk):
            yield lo, self.read_range(lo, min(self.length, lo + chunk))

    def release_staging(self) -> None:
        """Free the read buffer a large :meth:`take` grew (the sampler's per-hop reads are far smaller)."""
        with self._lock:
            for staging in self._pool:
                staging.release()

    def drop_cache(self) -> None:
        self.reader.drop_cache()

    def close(self) -> None:
        self.reader.close()


def stream_chunks(array, chunk: int = _STREAM_ELEMS):
    """``(first, values)`` chunks of an ndarray, memmap or DiskArray."""
    if isinstance(array, DiskArray):
        yield from array.chunks(chunk)
        return
    for lo in range(0, len(array), chunk):
        yield lo, np.asarray(array[lo:lo + chunk])


def indptr_fits(mode: str, budget: int, graphs) -> bool:
    """Whether indptr is held in memory: ``mode`` "memory", or "auto" when the compact indptrs of all
    ``graphs`` (``(num_nodes, num_edges)`` pairs, one per relation) cost at most a quarter of ``budget``."""
    if mode != "auto":
        return mode == "memory"
    return 4 * sum(compact_indptr_bytes(n, e) for n, e in graphs) <= budget


def appearance_counts(indices, num_nodes: int) -> np.ndarray:
    """How many in-neighbour lists each node appears in (its out-degree), streamed in bounded memory."""
    counts = np.zeros(num_nodes, np.int64)
    for _, part in stream_chunks(indices):
        counts += np.bincount(part, minlength=num_nodes)
    return counts


class ArrayTopology:
    """The CSC arrays in memory (or memory-mapped): lookups are array reads, nothing is counted as SSD traffic."""

    kind = "memory"

    def __init__(self, indptr, indices):
        if len(indptr) < 1:
            raise ValueError("indptr: must have num_nodes + 1 entries")
        self.indptr = indptr
        self.indices = indices
        self.num_nodes = len(indptr) - 1
        self.stats = TopologyStats()

    def lookup(self, frontier: np.ndarray) -> HopLookup:
        start = np.asarray(self.indptr[frontier], dtype=np.int64)
        deg = np.asarray(self.indptr[frontier + 1], dtype=np.int64) - start
        self.stats.add(lookups=len(frontier), hits=len(frontier))
        return HopLookup(start, deg)

    def neighbours(self, hop: HopLookup, owner: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return np.asarray(self.indices[positions], dtype=np.int64)

    def degrees(self, nodes: np.ndarray) -> np.ndarray:
        nodes = np.asarray(nodes, dtype=np.int64)
        return np.asarray(self.indptr[nodes + 1], np.int64) - np.asarray(self.indptr[nodes], np.int64)

    def describe(self) -> dict:
        return {"topology": self.kind, **self.stats.snapshot()}

    def new_epoch(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(slots=True)
class HotLists:
    """Cached in-neighbour lists: ``ids`` sorted; list of ``ids[k]`` is ``lists[ptr[k]:ptr[k+1]]``,
    starting at global position ``start[k]`` of ``indices``."""

    ids: np.ndarray
    start: np.ndarray
    ptr: np.ndarray
    lists: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.start.nbytes + self.ptr.nbytes + self.lists.nbytes

    @classmethod
    def empty(cls, index_dtype) -> "HotLists":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, index_dtype))


class SsdTopology:
    """CSC topology in its files, read through the storage engine; see [Note: topology on the SSD]."""

    kind = "ssd"

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: "memory": read indptr into RAM (compact, about 2.1 bytes per node); "ssd": read its entries per hop;
        #: "auto": memory when the compact form costs at most a quarter of ``budget``
        indptr: str = "auto"
        #: the topology's share of the memory budget that "auto" weighs indptr against (bytes)
        budget: int = 0
        direct: bool | str = "auto"

        def __post_init__(self) -> None:
            if self.indptr not in INDPTR_MODES:
                raise ValueError(f"indptr: must be one of {', '.join(INDPTR_MODES)}; got {self.indptr!r}")
            if self.budget < 0:
                raise ValueError(f"budget: must be >= 0, got {self.budget}")

    def __init__(self, indptr_path, indices_path, *, num_nodes: int, num_edges: int, index_dtype,
                 config: "SsdTopology.Config | None" = None, engine=None, **fields):
        cfg = self.config = config or SsdTopology.Config(**fields)
        self.num_nodes, self.num_edges = num_nodes, num_edges
        self.index_dtype = np.dtype(index_dtype)
        self.stats = TopologyStats()
        self.indices = DiskArray(indices_path, self.index_dtype, num_edges, engine=engine, direct=cfg.direct)
        disk_indptr = DiskArray(indptr_path, np.int64, num_nodes + 1, engine=engine, direct=cfg.direct)
        self.indptr_in_memory = indptr_fits(cfg.indptr, cfg.budget, [(num_nodes, num_edges)])
        if self.indptr_in_memory:
            try:  # streamed into its compact form: the int64 array is never held whole
                self.indptr = CompactIndptr(disk_indptr)
            finally:
                disk_indptr.close()
        else:
            self.indptr = disk_indptr
        self.hot = HotLists.empty(self.index_dtype)

    @property
    def memory_bytes(self) -> int:
        """Memory the topology holds: indptr if in RAM (its compact bytes), and the cached lists."""
        return (self.indptr.nbytes if self.indptr_in_memory else 0) + self.hot.nbytes

    # ------------------------------------------------------------------ sampling
    def lookup(self, frontier: np.ndarray) -> HopLookup:
        frontier = np.asarray(frontier, dtype=np.int64)
        hot = self.hot
        slot = np.searchsorted(hot.ids, frontier)
        slot[slot >= len(hot.ids)] = 0
        hit = (hot.ids[slot] == frontier) if len(hot.ids) else np.zeros(len(frontier), bool)
        slot[~hit] = -1
        start = np.empty(len(frontier), np.int64)
        deg = np.empty(len(frontier), np.int64)
        hs = slot[hit]
        start[hit] = hot.start[hs]
        deg[hit] = hot.ptr[hs + 1] - hot.ptr[hs]
        miss = np.flatnonzero(~hit)
        nbytes = calls = 0
        if len(miss):
            v = frontier[miss]
            if self.indptr_in_memory:
                lo, hi = self.indptr[v], self.indptr[v + 1]
            else:  # both ends of every uncached list in one submission
                both, nbytes, _ = self.indptr.take(np.concatenate([v, v + 1]))
                lo, hi = both[: len(v)], both[len(v):]
                calls = 1
            start[miss] = lo
            deg[miss] = hi - lo
        self.stats.add(lookups=len(frontier), hits=len(hs), misses=len(miss), indptr_calls=calls, ssd_bytes=nbytes,
                       ssd_blocks=nbytes // BLOCK)
        return HopLookup(start, deg, slot)

    def neighbours(self, hop: HopLookup, owner: np.ndarray, positions: np.ndarray) -> np.ndarray:
        out = np.empty(len(positions), np.int64)
        slot = hop.slot[owner]
        cached = slot >= 0
        if cached.any():
            s = slot[cached]
            out[cached] = self.hot.lists[self.hot.ptr[s] + positions[cached] - self.hot.start[s]]
        read = np.flatnonzero(~cached)
        if len(read):
            values, nbytes, blocks = self.indices.take(positions[read])  # one submission per hop
            out[read] = values
            self.stats.add(indices_calls=1, ssd_bytes=nbytes, ssd_blocks=blocks)
        return out

    # ------------------------------------------------------------------ cache
    def fill(self, nodes: np.ndarray, *, step_entries: int = 1 << 22) -> int:
        """Cache the whole in-neighbour lists of ``nodes`` (replacing any cached before). Returns bytes read.

        Read in groups of lists of about ``step_entries`` entries (a list longer than that alone): the
        positions of a read are int64 arrays, so an unbounded group (hub lists hold millions of entries)
        would cost far more transient memory than the cache itself.
        """
        nodes = np.unique(np.asarray(nodes, dtype=np.int64))
        starts, degs = self._ranges(nodes)
        ptr = np.zeros(len(nodes) + 1, np.int64)
        np.cumsum(degs, out=ptr[1:])
        self.hot = HotLists.empty(self.index_dtype)  # the old lists go before the new ones are read
        lists = np.empty(int(ptr[-1]), self.index_dtype)
        read, k = 0, 0
        while k < len(nodes):
            stop = max(k + 1, int(np.searchsorted(ptr, ptr[k] + step_entries, side="right")) - 1)
            s, d = starts[k:stop], degs[k:stop]
            pos = np.repeat(s - (ptr[k:stop] - ptr[k]), d) + np.arange(int(ptr[stop] - ptr[k]))
            values, nbytes, _ = self.indices.take(pos)
            lists[ptr[k]: ptr[stop]] = values
            read += nbytes
            k = stop
        self.hot = HotLists(nodes, starts, ptr, lists)
        # the degree lookups and list reads above are the largest this topology makes; per hop it reads far less
        self.indices.release_staging()
        if not self.indptr_in_memory:
            self.indptr.release_staging()
        return read

    def _ranges(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.indptr_in_memory:
            lo, hi = self.indptr[nodes], self.indptr[nodes + 1]
        else:
            both, _, _ = self.indptr.take(np.concatenate([nodes, nodes + 1]))
            lo, hi = both[: len(nodes)], both[len(nodes):]
        return lo.astype(np.int64), (hi - lo).astype(np.int64)

    def degrees(self, nodes: np.ndarray) -> np.ndarray:
        return self._ranges(np.asarray(nodes, dtype=np.int64))[1]

    def describe(self) -> dict:
        return {"topology": self.kind, "indptr": "memory" if self.indptr_in_memory else "ssd",
                "cached_lists": len(self.hot.ids), "cached_entries": int(len(self.hot.lists)),
                "memory_bytes": self.memory_bytes, **self.stats.snapshot()}

    def new_epoch(self) -> None:
        self.indices.drop_cache()
        if not self.indptr_in_memory:
            self.indptr.drop_cache()

    def close(self) -> None:
        self.indices.close()
        if not self.indptr_in_memory:
            self.indptr.close()


class Topologies:
    """Every relation's topology (one for a homogeneous graph) behind the one interface the pipeline and the
    epoch reports use: traffic summed over the relations."""

    def __init__(self, parts: dict):
        self.parts = dict(parts)

    @property
    def kind(self) -> str:
        return "ssd" if any(t.kind == "ssd" for t in self.parts.values()) else "memory"

    @property
    def stats(self) -> TopologyStats:
        total = TopologyStats()
        for topo in self.parts.values():
            total.add(**{k: v for k, v in topo.stats.snapshot().items() if k != "hit_rate"})
        return total

    def new_epoch(self) -> None:
        for topo in self.parts.values():
            topo.new_epoch()

    def describe(self) -> dict:
        """Traffic and kind; each relation's own description (the one relation's, of a homogeneous graph, at the
        top too)."""
        parts = {"___".join(et): t.describe() for et, t in self.parts.items()}
        one = next(iter(parts.values())) if len(parts) == 1 else {}
        return {**one, **self.stats.snapshot(), "topology": self.kind, "relations": parts,
                "memory_bytes": sum(getattr(t, "memory_bytes", 0) for t in self.parts.values())}
