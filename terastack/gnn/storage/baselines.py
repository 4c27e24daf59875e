"""The baselines' feature sources: every row in memory, and an ``np.memmap`` with its page cache held to a
budget (the common out-of-core approach); both behind :class:`terastack.gnn.storage.cache.FeatureSource`."""
from __future__ import annotations

import ctypes
import mmap
import os
import time

import numpy as np
import torch

from terastack.gnn.storage.cache import FeatureSource, torch_dtype_of
from terastack.gnn.storage.rows import covering_blocks


class InMemoryFeatures(FeatureSource):
    """All features in host memory (the in-memory baseline)."""

    name = "in_memory"

    def __init__(self, features: np.ndarray | torch.Tensor):
        super().__init__()
        self.features = torch.as_tensor(features)
        self.row_len = self.features.shape[1]
        self.torch_dtype = self.features.dtype

    def gather(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        idx = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        if out.device == self.features.device:
            torch.index_select(self.features, 0, idx, out=out)
        else:  # a device batch (the pipeline on a GPU): gathered here, then copied up
            out.copy_(self.features.index_select(0, idx), non_blocking=out.device.type == "cuda")
        self.stats.add(rows=len(ids), host_hits=len(ids), batches=1, gather_seconds=time.perf_counter() - started)
        return out


_libc = None


def _mincore(address: int, length: int) -> np.ndarray:
    """Per page of [address, address+length): 1 if resident in memory (mincore)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    vec = np.zeros(-(-length // mmap.PAGESIZE), np.uint8)
    if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), vec.ctypes.data_as(ctypes.c_void_p)) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return vec & 1


class MmapFeatures(FeatureSource):
    """Features in an ``np.memmap`` (the common out-of-core approach), page cache held to a budget.

    [Note: the mmap baseline's memory budget]
    An mmap reader gets the page cache for free, and on a machine with spare
    RAM the whole feature file ends up cached: that is in-memory training, not
    out-of-core. To hold it to the same host memory as terastack without
    privileges (a cgroup limit), the file's resident pages are measured with
    ``mincore`` after every batch; when they exceed ``budget``, the least
    recently used ones (by the batch that last touched them) are dropped
    (``MADV_DONTNEED`` on the mapping, then ``POSIX_FADV_DONTNEED`` on the file)
    down to 90% of the budget. That approximates the kernel's LRU under a memory
    limit. ``MADV_RANDOM`` turns off read-around: with it on, every fault reads
    128 KiB, which measured ~5x slower for scattered rows under a budget.

    [Note: the mmap baseline's concurrency]
    A gather through a mapping reads one page per fault, and one thread faults
    one page at a time: the SSD sees one request in flight (8.2k rows/s on a
    2-core VM whose disk does 79k random 4 KiB reads/s). Users get more in
    flight by gathering from several workers at once (PyG's
    ``NeighborLoader(num_workers=k)``, a DataLoader's workers): ``threads`` > 1
    splits every gather over that many threads (NumPy releases the GIL while it
    indexes, so their faults overlap; on the same VM, 4-KiB rows from a cold
    file: 4 threads 41k rows/s, 16 threads 76k). The budget is enforced after
    the whole batch, as with one thread (docs/gnn.md, "The np.memmap baselines").
    """

    name = "mmap"

    def __init__(self, path: str | os.PathLike, *, num_rows: int, row_len: int, dtype, budget: int | None,
                 random_advice: bool = True, threads: int = 1):
        super().__init__()
        if threads < 1:
            raise ValueError(f"threads: must be >= 1, got {threads}")
        self.threads = threads
        self._pool = None
        if threads > 1:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="terastack-mmap-gather")
        self.path = os.fspath(path)
        self.np_dtype = np.dtype(dtype)
        self.row_len = row_len
        self.row_bytes = row_len * self.np_dtype.itemsize
        self.torch_dtype = torch_dtype_of(self.np_dtype)
        self.budget = budget
        self.array = np.memmap(self.path, dtype=self.np_dtype, mode="r", shape=(num_rows, row_len))
        self._map = self.array._mmap
        if random_advice:
            self._map.madvise(mmap.MADV_RANDOM)
        self._fd = os.open(self.path, os.O_RDONLY)
        self.address = self.array.ctypes.data
        self.length = self.array.nbytes
        self._last_use = np.zeros(-(-self.length // mmap.PAGESIZE), np.int64)
        self._tick = 0
        self.evicted_pages = 0

    def gather(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        ids = np.asarray(ids, dtype=np.int64)
        if self._pool is None or len(ids) < 2 * self.threads:
            out.copy_(torch.from_numpy(self.array[ids]))
        else:  # [Note: the mmap baseline's concurrency]
            bounds = np.linspace(0, len(ids), self.threads + 1).astype(np.int64).tolist()
            parts = [self._pool.submit(self._gather_part, ids, out, a, b) for a, b in zip(bounds, bounds[1:])]
            for part in parts:
                part.result()
        if self.budget is not None:
            self._tick += 1
            self._last_use[covering_blocks(ids, self.row_bytes, mmap.PAGESIZE)] = self._tick
            resident = _mincore(self.address, self.length)
            if int(resident.sum()) * mmap.PAGESIZE > self.budget:
                self._evict(resident)
        self.stats.add(rows=len(ids), batches=1, gather_seconds=time.perf_counter() - started)
        return out

    def _gather_part(self, ids: np.ndarray, out: torch.Tensor, start: int, stop: int) -> None:
        out[start:stop].copy_(torch.from_numpy(self.array[ids[start:stop]]))

    def _evict(self, resident: np.ndarray) -> None:
        pages = np.flatnonzero(resident)
        keep = int(0.9 * self.budget) // mmap.PAGESIZE
        victims = np.sort(pages[np.argsort(self._last_use[pages], kind="stable")[: max(0, len(pages) - keep)]])
        if not len(victims):
            return
        breaks = np.flatnonzero(np.diff(victims) != 1) + 1
        starts = victims[np.concatenate([[0], breaks])]
        lengths = np.diff(np.concatenate([np.concatenate([[0], breaks]), [len(victims)]]))
        for first, count in zip((starts * mmap.PAGESIZE).tolist(), (lengths * mmap.PAGESIZE).tolist()):
            count = min(count, self.length - first)
            self._map.madvise(mmap.MADV_DONTNEED, first, count)
            os.posix_fadvise(self._fd, first, count, os.POSIX_FADV_DONTNEED)
        self.evicted_pages += len(victims)

    def new_epoch(self) -> None:
        self._map.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
