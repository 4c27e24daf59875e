"""External merge sort of 64-bit keys larger than the host budget.

Phase 1, run formation: the input is cut into chunks that fit the budget; each
chunk is read, sorted in memory (split over ``threads`` sorting threads, each
part becoming its own run) and written to a run file.
Phase 2, k-way merge: runs are merged block by block into the output. When
there are more runs than the budget can hold blocks for (``max_fan_in``),
earlier passes merge consecutive groups of runs into longer runs first.

[Note: the pipelined schedules]
Run formation cycles three chunk buffers: while chunk i is sorted, chunk i+1
is being read and the runs of chunk i-1 are being written. The merge keeps
two blocks per run (the one being merged and the next one, prefetched) and
two output buffers (one being filled, one being written). With
``pipelined=False`` every read and write is waited for when issued.

[Note: vectorized merge rounds]
A merge round takes, from every run's current block, the keys <= the
smallest "last key of the current block" over all runs: no key that any run
still has to deliver can be smaller than that bound, so those keys are final.
They are concatenated and sorted with a stable sort, which finds the sorted
pieces and merges them (O(n log runs)); at least one run empties its block
per round, so the loop always progresses.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from terastack import trace
from terastack.constants import BLOCK, DIRECT_ALIGN
from terastack.io import File, IOEngine, aligned_empty, completed, get_engine
from terastack.io.futures import Future

KEY = np.dtype("<i8")  # the sort treats the 8 bytes as signed little-endian integers
ALIGN_KEYS = DIRECT_ALIGN // KEY.itemsize  # blocks and chunks hold whole O_DIRECT blocks of keys
#: the smallest host budget: room for a few dozen blocks, so a merge has a useful fan-in
MIN_HOST_BUDGET = 64 * BLOCK


def file_bytes(keys: int) -> int:
    """Bytes to preallocate for a file of ``keys`` keys (fallocate refuses 0: at least one block)."""
    return max(keys * KEY.itemsize, BLOCK)


@dataclass(slots=True)
class Checksum:
    """Order-independent fingerprint of a multiset of keys (count, sum, xor, sum of a mixed hash)."""

    count: int = 0
    total: int = 0
    xor: int = 0
    mixed: int = 0

    def add(self, keys: np.ndarray) -> None:
        u = keys.view(np.uint64)
        self.count += len(u)
        with np.errstate(over="ignore"):
            self.total = (self.total + int(u.sum(dtype=np.uint64))) % 2**64
            h = (u ^ (u >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9)
            self.mixed = (self.mixed + int((h ^ (h >> np.uint64(32))).sum(dtype=np.uint64))) % 2**64
        self.xor ^= int(np.bitwise_xor.reduce(u)) if len(u) else 0


@dataclass(slots=True)
class SortStats:
    runs: int = 0
    merge_passes: int = 0
    run_formation_s: float = 0.0
    merge_s: float = 0.0
    wait_io_s: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    peak_buffer_bytes: int = 0
    phases: dict = field(default_factory=dict)


class ExternalSort:
    @dataclass(kw_only=True, slots=True)
    class Config:
        #: bytes of memory the sort may hold at once (its key buffers get all but a sixteenth: see buffer_bytes)
        host_budget: int
        #: sorting threads during run formation (each sorts its own part of a chunk)
        threads: int = 0
        pipelined: bool = True
        #: skip sorting/merging (moves the same bytes): the I/O-only measurement
        io_only: bool = False

        def __post_init__(self) -> None:
            if self.host_budget < MIN_HOST_BUDGET:
                raise ValueError(f"host_budget: at least 256 KiB, got {self.host_budget}")
            if self.threads < 0:
                raise ValueError(f"threads: must be >= 0 (0 = one per core), got {self.threads}")

    def __init__(self, config: "ExternalSort.Config", engine: IOEngine | None = None):
        self.config = config
        self.engine = engine or get_engine()
        self.threads = config.threads or min(4, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="terastack-sort")

    # ------------------------------------------------------------------ API
    def sort_file(self, src: str, dst: str, work_dir: str) -> SortStats:
        keys = os.path.getsize(src) // KEY.itemsize
        if os.path.getsize(src) % KEY.itemsize:
            raise ValueError(f"{src}: size {os.path.getsize(src)} is not a multiple of 8 (64-bit keys)")
        stats = SortStats()
        run_path = os.path.join(work_dir, "runs.bin")
        with self.engine.open(src, "r", direct=True) as fin, \
                self.engine.open(run_path, "w", direct=True, size=file_bytes(keys)) as frun:
            t0 = time.perf_counter()
            runs = self._form_runs(FileChunks(fin, keys), FileRuns(frun), stats)
            stats.run_formation_s = time.perf_counter() - t0
        stats.runs = len(runs)
        t0 = time.perf_counter()
        with self.engine.open(dst, "w", direct=True, size=file_bytes(keys)) as fout:
            self._merge_all(runs, FileLevel(self.engine, run_path, keys), FileOutput(fout), stats)
            fout.truncate(keys * 8)
            fout.sync()
        stats.merge_s = time.perf_counter() - t0
        os.unlink(run_path)
        return stats

    def sort_in_memory(self, keys: np.ndarray) -> tuple[np.ndarray, SortStats]:
        """The same two phases with no I/O at all (the compute-only measurement).

        ``keys`` is sorted in place into runs, then merged into a new array;
        both arrays are touched before the phases start, so page faults of
        fresh memory are not counted as sorting.
        """
        stats = SortStats()
        out = np.empty_like(keys)
        out.fill(0)
        source = InPlaceChunks(keys)
        t0 = time.perf_counter()
        runs = self._form_runs(source, source, stats)
        stats.run_formation_s = time.perf_counter() - t0
        stats.runs = len(runs)
        t0 = time.perf_counter()
        self._merge_all(runs, MemoryLevel(keys), MemoryOutput(0, into=out), stats)
        stats.merge_s = time.perf_counter() - t0
        return out, stats

    def _merge_all(self, runs: list[tuple[int, int]], level, final_sink, stats: SortStats) -> None:
        fan_in = self.max_fan_in()
        while len(runs) > fan_in:
            # Consecutive runs cover consecutive key ranges, so a merged group keeps its range.
            groups = [runs[g:g + fan_in] for g in range(0, len(runs), fan_in)]
            level = level.merge_groups(self, groups, stats)
            runs = [(g[0][0], sum(length for _, length in g)) for g in groups]
            stats.merge_passes += 1
        level.merge_into(self, runs, final_sink, stats)
        stats.merge_passes += 1

    def close(self) -> None:
        self._pool.shutdown()

    # ---------------------------------------------------------- run formation
    def buffer_bytes(self) -> int:
        """The part of the budget for key buffers. The rest, a sixteenth, is for what the sort holds beside them
        (a merge round's temporaries, the interpreter's objects): with buffers sized to the whole budget, peak
        resident memory measured 0.1-0.3% over it on a 16 MiB budget."""
        return self.config.host_budget - self.config.host_budget // 16

    def chunk_keys(self) -> int:
        """Keys per chunk: three chunk buffers fit the buffer budget."""
        return max(ALIGN_KEYS, self.buffer_bytes() // 3 // KEY.itemsize // ALIGN_KEYS * ALIGN_KEYS)

    def _form_runs(self, source, sink, stats: SortStats) -> list[tuple[int, int]]:
        chunk = self.chunk_keys()
        total = source.keys
        n_chunks = -(-total // chunk)
        buffers = [aligned_empty(chunk, KEY) for _ in range(min(3, n_chunks))] if source.needs_buffers else []
        stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, sum(b.nbytes for b in buffers))
        pipelined = self.config.pipelined
        reads: dict[int, Future] = {}
        writes: dict[int, Future] = {}
        runs: list[tuple[int, int]] = []

        def start_read(i: int) -> None:
            start, count = i * chunk, min(chunk, total - i * chunk)
            reads[i] = source.read(start, count, buffers[i % len(buffers)][:count] if buffers else None)

        # prologue
        start_read(0)
        for i in range(n_chunks):
            start = i * chunk
            buf = self._wait(reads.pop(i), stats, f"read chunk {i}")
            # steady state: read i+1 (its buffer was last used by the runs of chunk i-2)
            if i + 1 < n_chunks:
                if i - 2 in writes:
                    self._wait(writes.pop(i - 2), stats, f"write runs of chunk {i - 2}")
                if pipelined:
                    start_read(i + 1)
            with trace.span(f"sort chunk {i}", track="compute"):
                parts = self._sort_parallel(buf)
            for offset, length in parts:
                runs.append((start + offset, length))
            writes[i] = sink.write(start, buf)
            if not pipelined:
                self._wait(writes.pop(i), stats, f"write runs of chunk {i}")
                if i + 1 < n_chunks:
                    start_read(i + 1)
        # epilogue
        for i in sorted(writes):
            self._wait(writes.pop(i), stats, f"write runs of chunk {i}")
        stats.bytes_read += total * KEY.itemsize
        stats.bytes_written += total * KEY.itemsize
        return runs

    def _sort_parallel(self, buf: np.ndarray) -> list[tuple[int, int]]:
        """Sort ``threads`` contiguous parts of ``buf`` in place; each part is one run."""
        n = len(buf)
        parts = max(1, min(self.threads, n // ALIGN_KEYS))
        bounds = [n * k // parts // ALIGN_KEYS * ALIGN_KEYS for k in range(parts)] + [n]
        pieces = [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(parts) if bounds[k + 1] > bounds[k]]
        if not self.config.io_only:
            futures = [self._pool.submit(buf[o:o + c].sort) for o, c in pieces]
            for f in futures:
                f.result()
        return pieces

    # ------------------------------------------------------------------ merge
    #: merge blocks below this size make the merge a stream of tiny requests
    MIN_BLOCK_BYTES = 16 << 10

    def max_fan_in(self) -> int:
        """Runs one merge pass can take within the budget (5 blocks per run, see block_keys)."""
        return max(2, self.buffer_bytes() // (5 * self.MIN_BLOCK_BYTES))

    def block_keys(self, runs: int) -> int:
        """Keys per merge block: 2 blocks per run in flight, the round's candidates, 2 output buffers."""
        per_block = self.buffer_bytes() // KEY.itemsize // (5 * max(1, runs))
        return max(ALIGN_KEYS, per_block // ALIGN_KEYS * ALIGN_KEYS)

    def _merge(self, source, runs: list[tuple[int, int]], sink, stats: SortStats) -> None:
        r = len(runs)
        block = self.block_keys(r)
        out_cap = block * r
        pipelined = self.config.pipelined
        out_buffers = [aligned_empty(out_cap, KEY) for _ in range(2)]
        spare = [aligned_empty(block, KEY) for _ in range(2 * r)] if source.needs_buffers else []
        stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, sum(b.nbytes for b in out_buffers + spare))
        offsets = [start for start, _ in runs]
        ends = [start + length for start, length in runs]
        current: list[np.ndarray | None] = [None] * r
        upcoming: list[Future | None] = [None] * r
        free_bufs = list(range(len(spare)))
        buf_of: dict[int, list[int]] = {i: [] for i in range(r)}

        def issue(i: int) -> Future | None:
            """Start reading run i's next block (None when the run is exhausted)."""
            if offsets[i] >= ends[i]:
                return None
            count = min(block, ends[i] - offsets[i])
            target = None
            if spare:
                slot = free_bufs.pop()
                buf_of[i].append(slot)
                target = spare[slot][:count]
            fut = source.read(offsets[i], count, target)
            offsets[i] += count
            return fut

        def advance(i: int) -> None:
            """Make run i's next block current (waiting for it) and prefetch the one after."""
            if spare and current[i] is not None:
                free_bufs.append(buf_of[i].pop(0))
            nxt = upcoming[i] if upcoming[i] is not None else issue(i)
            current[i] = None if nxt is None else self._wait(nxt, stats, f"read block of run {i}")
            upcoming[i] = issue(i) if pipelined and current[i] is not None else None

        # prologue: first block of every run, and the second one on its way
        for i in range(r):
            advance(i)
        pending_write: Future | None = None
        out_index = 0
        written = 0
        while True:
            live = [i for i in range(r) if current[i] is not None]
            if not live:
                break
            # steady state: one merge round (see [Note: vectorized merge rounds])
            out = out_buffers[out_index]
            takes, n_out = self._merge_round(current, live, out)
            if pending_write is not None:
                self._wait(pending_write, stats, "write output")
            pending_write = sink.write(written, out[:n_out])
            if not pipelined:
                self._wait(pending_write, stats, "write output")
                pending_write = None
            written += n_out
            out_index ^= 1
            for i, t in takes:
                current[i] = current[i][t:]
                if len(current[i]) == 0:
                    advance(i)
        # epilogue
        if pending_write is not None:
            self._wait(pending_write, stats, "write output")
        stats.bytes_read += sum(length for _, length in runs) * KEY.itemsize
        stats.bytes_written += written * KEY.itemsize

    def _merge_round(self, current: list, live: list[int], out: np.ndarray) -> tuple[list[tuple[int, int]], int]:
        """One merge round into ``out``: from each live run, its keys up to the smallest of the runs' last keys
        ([Note: vectorized merge rounds]); the (run, keys taken) pairs and the keys written."""
        with trace.span("merge round", track="compute"):
            if self.config.io_only:  # unsorted data: move whole blocks, the same bytes
                takes = [(i, len(current[i])) for i in live]
            else:
                bound = min(current[i][-1] for i in live)
                takes = [(i, int(np.searchsorted(current[i], bound, side="right"))) for i in live]
            n_out = sum(t for _, t in takes)
            pos = 0
            for i, t in takes:
                out[pos:pos + t] = current[i][:t]
                pos += t
            if not self.config.io_only:
                out[:n_out].sort(kind="stable")
        return takes, n_out

    def _wait(self, fut: Future, stats: SortStats, label: str):
        t0 = time.perf_counter()
        with trace.span(f"wait {label}", track="compute"):
            value = fut.result()
        stats.wait_io_s += time.perf_counter() - t0
        return value


# ------------------------------------------------------------ sources and sinks
class FileLevel:
    """The runs of one merge level, in one file on SSD."""

    def __init__(self, engine: IOEngine, path: str, keys: int):
        self.engine, self.path, self.keys = engine, path, keys

    def merge_groups(self, sorter: "ExternalSort", groups, stats: SortStats) -> "FileLevel":
        nxt = self.path + ".next"
        with self.engine.open(self.path, "r", direct=True) as fin, \
                self.engine.open(nxt, "w", direct=True, size=file_bytes(self.keys)) as fout:
            for group in groups:
                sorter._merge(FileBlocks(fin), group, FileOutput(fout, base=group[0][0]), stats)
        os.replace(nxt, self.path)
        return self

    def merge_into(self, sorter: "ExternalSort", runs, sink, stats: SortStats) -> None:
        with self.engine.open(self.path, "r", direct=True) as fin:
            sorter._merge(FileBlocks(fin), runs, sink, stats)


class MemoryLevel:
    def __init__(self, data: np.ndarray):
        self.data = data

    def merge_groups(self, sorter: "ExternalSort", groups, stats: SortStats) -> "MemoryLevel":
        merged = np.empty_like(self.data)
        for group in groups:
            sorter._merge(MemoryBlocks(self.data), group, MemoryOutput(0, into=merged, base=group[0][0]), stats)
        return MemoryLevel(merged)

    def merge_into(self, sorter: "ExternalSort", runs, sink, stats: SortStats) -> None:
        sorter._merge(MemoryBlocks(self.data), runs, sink, stats)


class FileChunks:
    needs_buffers = True

    def __init__(self, f: File, keys: int):
        self.f, self.keys = f, keys

    def read(self, start: int, count: int, buf: np.ndarray) -> Future:
        return self.f.pread(buf, start * KEY.itemsize).then(lambda _: buf)


class FileRuns:
    """Runs written at the same key offsets they had in the input (one file, no gaps)."""

    def __init__(self, f: File):
        self.f = f

    def write(self, start: int, buf: np.ndarray) -> Future:
        return self.f.pwrite(buf, start * KEY.itemsize)


class FileBlocks:
    needs_buffers = True

    def __init__(self, f: File):
        self.f = f

    def read(self, start: int, count: int, target: np.ndarray) -> Future:
        return self.f.pread(target, start * KEY.itemsize).then(lambda _: target)


class FileOutput:
    def __init__(self, f: File, base: int = 0):
        self.f, self.base = f, base

    def write(self, start: int, keys: np.ndarray) -> Future:
        return self.f.pwrite(keys, (self.base + start) * KEY.itemsize)


class InPlaceChunks:
    """Chunks of an array in memory, sorted where they are: runs form in place, nothing is copied."""

    needs_buffers = False

    def __init__(self, keys: np.ndarray):
        self.data, self.keys = keys, len(keys)

    def read(self, start: int, count: int, buf) -> Future:
        return completed(self.data[start:start + count])

    def write(self, start: int, buf: np.ndarray) -> Future:
        return completed(len(buf))  # the runs already are where they belong


class MemoryBlocks:
    needs_buffers = False

    def __init__(self, data: np.ndarray):
        self.data = data

    def read(self, start: int, count: int, target) -> Future:
        return completed(self.data[start:start + count])


class MemoryOutput:
    def __init__(self, keys: int, *, into: np.ndarray | None = None, base: int = 0):
        self.data = np.empty(keys, KEY) if into is None else into
        self.base = base

    def write(self, start: int, keys: np.ndarray) -> Future:
        self.data[self.base + start:self.base + start + len(keys)] = keys
        return completed(len(keys))
