"""Where a batch's feature rows come from: the unified static cache over SSD, and the baselines.

[Note: unified static cache]
From pre-sampled access counts, nodes are ranked hottest first. The first
``device_budget // row_bytes`` ranked rows live in the device tier, the next
ones in the host tier (whose budget also pays for the lookup table, 4 bytes per
node), the rest only on SSD. Placement is static: it is decided once, filled
once (one sequential O_DIRECT scan of the feature file when the cached rows
cover much of it, else block reads), and never changes, so a lookup is a single
vectorized table read with no locking: ``table[id]`` is a device slot
(< device rows), a host slot (>= device rows) or -1 (miss).

A gather splits a batch's ids into device hits, host hits and misses. The
misses' SSD request (one ``pread_many``, see [Note: row reads are block reads])
is submitted first; the cache copies run while the SSD works; then the missed
rows are cut out of the staging buffer. Lookup is thus separated from disk
I/O and overlaps it.

Without an accelerator the device tier is host memory with its own budget
(see terastack.tiers [Note: tiers without an accelerator]); with CUDA it is a
device tensor, host hits and misses are staged in pinned memory and copied on
a side stream.

Every source fills ``out`` with exactly the bytes of the feature file, so a
batch is bit-identical whichever source served it (tests check this per tier
mix).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from terastack.constants import BLOCK
from terastack.counters import Counters
from terastack.gnn.storage.rows import RowReader, Staging
from terastack.errors import BudgetError
from terastack.memory import mem_available
from terastack.tiers.budget import BudgetLedger
from terastack.units import format_bytes, parse_bytes


@dataclass(slots=True)
class GatherStats(Counters):
    """Cumulative traffic of a feature source."""

    rows: int = 0
    device_hits: int = 0
    host_hits: int = 0
    misses: int = 0
    ssd_bytes: int = 0
    ssd_blocks: int = 0
    ssd_extents: int = 0
    ssd_calls: int = 0
    batches: int = 0
    gather_seconds: float = 0.0
    io_wait_seconds: float = 0.0
    def snapshot(self) -> dict:
        with self._lock:
            rows = max(self.rows, 1)
            return {"rows": self.rows, "batches": self.batches, "device_hits": self.device_hits,
                    "host_hits": self.host_hits, "misses": self.misses,
                    "device_hit_rate": self.device_hits / rows, "host_hit_rate": self.host_hits / rows,
                    "miss_rate": self.misses / rows, "ssd_bytes": self.ssd_bytes, "ssd_blocks": self.ssd_blocks,
                    "ssd_extents": self.ssd_extents, "ssd_calls": self.ssd_calls,
                    "gather_seconds": self.gather_seconds, "io_wait_seconds": self.io_wait_seconds}


def resolve_device(name: str) -> torch.device:
    """The device a ``device`` setting names: "auto" is CUDA when available, else the CPU (the rule
    terastack.tiers applies to its own ``device`` setting)."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda" and device.index is None:  # by index: the pipeline's threads would pick device 0
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def torch_dtype_of(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


#: how long a gather waits for another thread's older gather before it gives up with an error
IN_FLIGHT_WAIT_S = 300.0


class Gathering:
    """A gather begun by :meth:`FeatureSource.begin`: ``finish()`` completes it (at most once) and returns ``out``."""

    __slots__ = ("_out", "_complete")

    def __init__(self, out, complete=None):
        self._out, self._complete = out, complete

    def finish(self):
        if self._complete is not None:
            complete, self._complete = self._complete, None
            complete()
        return self._out


class FeatureSource:
    """Fills ``out[i] = features[ids[i]]``. Subclasses: UnifiedCache, InMemoryFeatures, MmapFeatures."""

    name = "source"
    row_len: int
    torch_dtype: torch.dtype

    def __init__(self) -> None:
        self.stats = GatherStats()

    def gather(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def begin(self, ids: np.ndarray, out: torch.Tensor) -> "Gathering":
        """Start filling ``out`` with rows ``ids``; ``finish()`` on the result completes it and returns ``out``.
        Sources that read from disk return with the reads in flight, so the caller can cut the previous batch's
        rows meanwhile ([Note: one batch's reads in flight while the last is cut]); the rest gather now."""
        return Gathering(self.gather(ids, out))

    def new_epoch(self) -> None:
        """Called before each epoch (sources reading from disk drop the file's page cache here)."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class UnifiedCache(FeatureSource):
    """Device + host static cache over the SSD feature file; see [Note: unified static cache]."""

    name = "terastack"

    @dataclass(kw_only=True, slots=True)
    class Config:
        device_budget: int | str = 0
        host_budget: int | str = 0
        #: "auto": CUDA when available, else the device tier is host memory with its own budget
        device: str = "auto"
        direct: bool | str = "auto"
        #: refuse budgets larger than the memory that exists (off only for tests of the error path)
        check_memory: bool = True

        def __post_init__(self) -> None:
            self.device_budget = parse_bytes(self.device_budget, field="device_budget")
            self.host_budget = parse_bytes(self.host_budget, field="host_budget")
            if self.device not in ("auto", "cpu") and not str(self.device).startswith("cuda"):
                raise ValueError(f"device: must be auto, cpu or cuda[:N]; got {self.device!r}")
            if str(self.device).startswith("cuda") and not torch.cuda.is_available():
                raise ValueError(f"device: {self.device!r} requested but CUDA is not available")

    def __init__(self, dataset, ranking: np.ndarray, config: "UnifiedCache.Config | None" = None, *, engine=None,
                 **fields):
        """``ranking``: node ids hottest first (:meth:`Hotness.order`); nodes not in it are never cached."""
        super().__init__()
        cfg = self.config = config or UnifiedCache.Config(**fields)
        self.device = resolve_device(cfg.device)
        n, self.row_len = dataset.num_nodes, dataset.feat_dim
        self.num_nodes = n
        self.np_dtype = dataset.feat_dtype
        self.torch_dtype = torch_dtype_of(self.np_dtype)
        self.row_bytes = dataset.row_bytes
        ranking = np.asarray(ranking, dtype=np.int64).ravel()
        if ranking.size and (ranking.min() < 0 or ranking.max() >= n):
            raise ValueError(f"ranking: node ids must be in 0..{n - 1}")
        self._check_budgets()
        self.budgets = {"device": BudgetLedger("device", cfg.device_budget),
                        "host": BudgetLedger("host", cfg.host_budget)}
        table_dtype = np.int32 if n < 2**31 else np.int64
        table_bytes = n * np.dtype(table_dtype).itemsize
        if cfg.host_budget + cfg.device_budget > 0:  # with no cache at all there is nothing to look up
            self.budgets["host"].reserve(table_bytes, what=f"the cache lookup table of {n} nodes "
                                                           "(the host budget pays for it)")
        self.device_rows = int(min(len(ranking), cfg.device_budget // self.row_bytes))
        self.host_rows = int(min(len(ranking) - self.device_rows,
                                 max(0, cfg.host_budget - table_bytes) // self.row_bytes))
        self.device_ids = np.sort(ranking[: self.device_rows])
        self.host_ids = np.sort(ranking[self.device_rows: self.device_rows + self.host_rows])
        self.table = np.full(n, -1, table_dtype)
        self.table[self.device_ids] = np.arange(self.device_rows)
        self.table[self.host_ids] = self.device_rows + np.arange(self.host_rows)
        if np.count_nonzero(self.table >= 0) != self.device_rows + self.host_rows:
            raise ValueError("ranking: node ids must be distinct")
        self.budgets["device"].reserve(self.device_rows * self.row_bytes, what="device cache rows")
        self.budgets["host"].reserve(self.host_rows * self.row_bytes, what="host cache rows")
        self.reader = RowReader(dataset.features_path, num_rows=n, row_len=self.row_len, dtype=self.np_dtype,
                                direct=cfg.direct, engine=engine)
        # one gather's CPU work at a time; each of the (at most two) gathers whose reads are in flight has its own
        # staging buffer ([Note: one batch's reads in flight while the last is cut])
        self._gather_lock = threading.Condition()
        self._stagings = (Staging(), Staging())
        self._in_flight: list = []  # the begun, unfinished gathers' staging buffers, oldest first
        from terastack import io

        self.host_cache = io.aligned_empty((self.host_rows, self.row_len), self.np_dtype)
        self._host_t = torch.from_numpy(self.host_cache)
        # not page-locked: only the CPU reads the host cache (hits are gathered into the pinned staging buffer,
        # which is what the GPU copies from); locking it would take the whole cache from the OS for nothing
        if self.device.type == "cuda":
            self._device_t = torch.empty(self.device_rows, self.row_len, dtype=self.torch_dtype, device=self.device)
            self._side_stream = torch.cuda.Stream(self.device)
            self._staging = torch.empty(0, self.row_len, dtype=self.torch_dtype).pin_memory()
            self._staging_event = None
        else:
            self._device_t = torch.from_numpy(io.aligned_empty((self.device_rows, self.row_len), self.np_dtype))
        started = time.perf_counter()
        self.fill_bytes_read = self._fill()
        self.fill_seconds = time.perf_counter() - started
        # the fill's reads (up to 65,536 rows' blocks at once, ~320 MB) are not a batch's: gathers grow their own
        self.reader.release_staging()

    # ------------------------------------------------------------------ setup
    def _check_budgets(self) -> None:
        cfg = self.config
        if not cfg.check_memory:
            return
        available = mem_available()
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            if cfg.device_budget > total:
                raise BudgetError("device", needed=cfg.device_budget, available=total, limit=total,
                                  what="the device cache (device_budget is larger than the accelerator's memory)")
            host_need = cfg.host_budget
        else:
            host_need = cfg.host_budget + cfg.device_budget  # both tiers are host memory here
        if available and host_need > available:
            which = "host" if self.device.type == "cuda" or not cfg.device_budget else "host+device"
            raise BudgetError(which, needed=host_need, available=available, limit=available,
                              what=f"the feature cache ({which} budget {format_bytes(host_need)} is larger than the "
                                   f"{format_bytes(available)} of memory available)")

    def _fill(self) -> int:
        """Read the cached rows from SSD once. Returns bytes read."""
        cached = np.concatenate([self.device_ids, self.host_ids])
        if len(cached) == 0:
            return 0
        blocks = len(self.reader.blocks_for(cached))
        read = 0
        if blocks * BLOCK * 4 > self.reader.file_size:  # dense enough: one sequential pass is cheaper
            for first, rows in self.reader.scan():
                slots = self.table[first: first + len(rows)].astype(np.int64)
                hit = np.flatnonzero(slots >= 0)
                self._store(slots[hit], rows[torch.from_numpy(hit)])
                read += rows.numel() * rows.element_size()
        else:
            step = 1 << 16
            for start in range(0, len(cached), step):
                ids = cached[start:start + step]
                rows = self.reader.read(ids)
                self._store(self.table[ids].astype(np.int64), rows)
                read += len(self.reader.blocks_for(ids)) * BLOCK
        return read

    def _store(self, slots: np.ndarray, rows: torch.Tensor) -> None:
        dev = slots < self.device_rows
        if dev.any():
            sel = torch.from_numpy(np.flatnonzero(dev))
            self._device_t.index_copy_(0, torch.from_numpy(slots[dev]).to(self._device_t.device),
                                       rows.index_select(0, sel).to(self._device_t.device))
        if (~dev).any():
            sel = torch.from_numpy(np.flatnonzero(~dev))
            self._host_t.index_copy_(0, torch.from_numpy(slots[~dev] - self.device_rows), rows.index_select(0, sel))

    # ----------------------------------------------------------------- lookup
    def lookup(self, ids: np.ndarray):
        """Positions in ``ids`` of device hits, host hits and misses, and the cache slots of the hits."""
        loc = self.table[ids]
        dev_pos = np.flatnonzero((loc >= 0) & (loc < self.device_rows))
        host_pos = np.flatnonzero(loc >= self.device_rows)
        miss_pos = np.flatnonzero(loc < 0)
        return (dev_pos, loc[dev_pos].astype(np.int64), host_pos,
                loc[host_pos].astype(np.int64) - self.device_rows, miss_pos)

    def gather(self, ids: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        return self.begin(ids, out).finish()

    def begin(self, ids: np.ndarray, out: torch.Tensor) -> Gathering:
        """Look the rows up, submit the misses' block reads, copy the hits; ``finish()`` waits for the reads
        and cuts the missed rows out of the blocks. At most two may be begun and unfinished, finished in the
        order begun (the pipeline keeps one in flight while it finishes the one before).

        [Note: one batch's reads in flight while the last is cut]
        A gather that submits its reads, waits, and cuts leaves the disk without feature reads while it cuts
        and while it looks up and copies the next batch's hits (a tenth of a batch at the 48M-node scale run).
        The pipeline's gather thread begins batch k+1 (its reads queue behind batch k's) before it finishes
        batch k, so the disk always has the next batch's reads. Each of the two has its own staging buffer,
        so the blocks of one are never overwritten by the other's. On a CUDA device the gather runs whole
        here (its staging copies are ordered by the side stream's event)."""
        with self._gather_lock:
            if out.device.type == "cuda":
                started = time.perf_counter()
                ids = np.asarray(ids, dtype=np.int64)
                dev_pos, dev_slot, host_pos, host_slot, miss_pos = self.lookup(ids)
                request = self.reader.submit(ids[miss_pos])  # the SSD works while the cache copies run
                io_wait = self._gather_cuda(out, dev_pos, dev_slot, host_pos, host_slot, miss_pos, request)
                self._count(ids, dev_pos, host_pos, miss_pos, request, time.perf_counter() - started, io_wait)
                return Gathering(out)
            # a third waits for the oldest to finish (another thread's; the pipeline never begins a third)
            if not self._gather_lock.wait_for(lambda: len(self._in_flight) < len(self._stagings), IN_FLIGHT_WAIT_S):
                raise RuntimeError(f"unified cache: two gathers stayed in flight for {IN_FLIGHT_WAIT_S:g} s; finish "
                                   "one before beginning another")
            started = time.perf_counter()
            ids = np.asarray(ids, dtype=np.int64)
            dev_pos, dev_slot, host_pos, host_slot, miss_pos = self.lookup(ids)
            staging = next(s for s in self._stagings if all(s is not f for f in self._in_flight))
            request = self.reader.submit(ids[miss_pos], staging=staging)  # the SSD works while the copies run
            self._in_flight.append(staging)
            t = torch.from_numpy
            if len(dev_pos):
                out.index_copy_(0, t(dev_pos), self._device_t.index_select(0, t(dev_slot)))
            if len(host_pos):
                out.index_copy_(0, t(host_pos), self._host_t.index_select(0, t(host_slot)))
            begun = time.perf_counter() - started

        def complete() -> None:
            with self._gather_lock:
                # in the order begun (another thread's older gather first): their reads completed in that order
                if not self._gather_lock.wait_for(lambda: self._in_flight[0] is staging, IN_FLIGHT_WAIT_S):
                    raise RuntimeError(f"unified cache: an older gather stayed unfinished for {IN_FLIGHT_WAIT_S:g} s; "
                                       "gathers finish in the order they were begun")
                resumed = time.perf_counter()
                try:
                    self.reader.finish(request, out, t(miss_pos))
                finally:
                    self._in_flight.remove(staging)
                    self._gather_lock.notify_all()
                cut = time.perf_counter() - resumed
                self._count(ids, dev_pos, host_pos, miss_pos, request, begun + cut, request.waited)

        return Gathering(out, complete)

    def _count(self, ids, dev_pos, host_pos, miss_pos, request, seconds: float, io_wait: float) -> None:
        self.stats.add(rows=len(ids), device_hits=len(dev_pos), host_hits=len(host_pos), misses=len(miss_pos),
                       ssd_bytes=request.nbytes, ssd_blocks=request.blocks, ssd_extents=request.extents,
                       ssd_calls=1 if request.blocks else 0, batches=1, gather_seconds=seconds,
                       io_wait_seconds=io_wait)

    def _gather_cuda(self, out, dev_pos, dev_slot, host_pos, host_slot, miss_pos, request) -> float:
        """GPU path: host hits and misses staged in pinned memory, copied on a side stream, scattered on device."""
        dev = out.device
        if self._staging_event is not None:
            self._staging_event.synchronize()  # the previous batch's copy out of the staging buffer is done
        n_host, n_miss = len(host_pos), len(miss_pos)
        if self._staging.shape[0] < n_host + n_miss:
            self._staging = torch.empty(int((n_host + n_miss) * 1.25) + 1, self.row_len, dtype=self.torch_dtype
                                        ).pin_memory()
        staging = self._staging[: n_host + n_miss]
        if n_host:
            torch.index_select(self._host_t, 0, torch.from_numpy(host_slot), out=staging[:n_host])
        if len(dev_pos):
            idx = torch.from_numpy(dev_slot).to(dev, non_blocking=True)
            out.index_copy_(0, torch.from_numpy(dev_pos).to(dev, non_blocking=True), self._device_t.index_select(0, idx))
        waited = time.perf_counter()
        self.reader.finish(request, staging[n_host:])
        io_wait = time.perf_counter() - waited
        positions = torch.from_numpy(np.concatenate([host_pos, miss_pos]))
        stream = self._side_stream
        current = torch.cuda.current_stream(dev)
        with torch.cuda.stream(stream):
            # both made on the side stream and read on the current one: without record_stream the allocator
            # hands their blocks to the next gather's side-stream copies before this index_copy_ ran
            rows = staging.to(dev, non_blocking=True)
            pos = positions.pin_memory().to(dev, non_blocking=True)
            self._staging_event = torch.cuda.Event()
            self._staging_event.record(stream)
        current.wait_stream(stream)
        rows.record_stream(current)
        pos.record_stream(current)
        out.index_copy_(0, pos, rows)
        return io_wait

    # ----------------------------------------------------------------- report
    def new_epoch(self) -> None:
        self.reader.drop_cache()

    def describe(self) -> dict:
        return {"device": str(self.device), "device_rows": self.device_rows, "host_rows": self.host_rows,
                "device_bytes": self.device_rows * self.row_bytes, "host_bytes": self.host_rows * self.row_bytes,
                "table_bytes": self.table.nbytes, "budgets": {k: b.snapshot() for k, b in self.budgets.items()},
                "cached_fraction": (self.device_rows + self.host_rows) / max(self.num_nodes, 1),
                "fill_seconds": self.fill_seconds,
                "fill_bytes_read": self.fill_bytes_read, "io": self.reader.direct_reason,
                "staging_bytes": self.reader.staging_bytes + sum(st.buffer.nbytes for st in self._stagings)}

    def close(self) -> None:
        self.reader.close()
