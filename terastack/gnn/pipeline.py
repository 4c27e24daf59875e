"""The training pipeline: sampling batch k+2, gathering batch k+1, training batch k, all at once.

[Note: pipeline schedule]
One loop per stage, each in its own thread except training (the caller's loop):

    sampler thread:  for k: sample(k)                -> sampled queue (capacity `depth`)
    gather thread:   for k: take a free slot, gather(k) into it -> ready queue (capacity `depth`)
    caller:          for k: take ready(k), train(k), give its slot back

Prologue: the sampler runs ahead while the gather thread fills the first slot;
the caller's first ``next()`` waits for batch 0. Steady state: with depth 1 the
sampler is at k+2 while gather is at k+1 and training is at k. Epilogue: the
sampler sends an end marker through the queues; the caller drains and joins.

Memory is bounded: ``depth + 2`` feature slots exist (one trained on, ``depth``
ready, one being filled), each grown only to the largest batch it has held,
and at most ``depth`` sampled batches wait. A batch's ``x`` is a view of its
slot and is valid until the caller asks for the next batch (clone it to keep it).

Shutdown: an exception in a stage travels down the queues in order, so the
caller receives every batch before the failed one and then a
:class:`PipelineError` naming the stage and batch; the stages stop. Closing the
iterator early (break, exception in the training step) stops and joins the
threads. Every wait polls a stop flag and gives up after ``wait_timeout_s``
with a :class:`TimeoutError` naming what it waited for, so nothing hangs.

``overlap=False`` runs the same three stages one after another in the caller's
thread: the synchronous baseline.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from terastack import trace
from terastack.gnn.cache import FeatureSource, resolve_device
from terastack.gnn.sampler import NeighborSampler, SampledBatch, epoch_batches

_POLL = 0.05
_END = object()


@dataclass(slots=True)
class _Failure:
    """A stage's exception, passed down the queues in batch order."""

    stage: str
    batch: int | None
    exc: BaseException


class PipelineError(RuntimeError):
    """A pipeline stage failed; ``stage`` and ``batch`` say where, ``__cause__`` is the original error."""

    def __init__(self, stage: str, batch: int | None, exc: BaseException):
        where = f" at batch {batch}" if batch is not None else ""
        super().__init__(f"pipeline {stage} stage failed{where}: {type(exc).__name__}: {exc}")
        self.stage, self.batch = stage, batch


@dataclass(slots=True)
class EpochStats:
    batches: int = 0
    sample_seconds: float = 0.0
    gather_seconds: float = 0.0
    #: time the caller waited for a ready batch (the pipeline did not keep up with training)
    stall_seconds: float = 0.0
    max_rows: int = 0
    #: seed nodes trained on (this rank's share, with several ranks)
    seeds: int = 0
    slot_bytes: list = field(default_factory=list)


class Pipeline:
    """Feeds PyG ``Data`` batches to a training loop from a feature source; see [Note: pipeline schedule]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: batches each queue holds (sampled, ready); memory grows with it
        depth: int = 1
        #: False: sample, gather and train one after another (the synchronous baseline)
        overlap: bool = True
        #: every wait gives up after this long, naming what it waited for
        wait_timeout_s: float = 300.0
        #: where batches go ("auto": CUDA if available, else CPU)
        device: str = "auto"
        #: data parallelism: this rank trains on seeds rank, rank + world_size, ... of every global batch
        #: (terastack.gnn.data_parallel [Note: data-parallel GNN training])
        rank: int = 0
        world_size: int = 1

        def __post_init__(self) -> None:
            if not 0 <= self.rank < self.world_size:
                raise ValueError(f"rank: must be in 0..world_size-1 = {self.world_size - 1}, got {self.rank}")
            if not isinstance(self.depth, int) or self.depth < 1:
                raise ValueError(f"depth: must be an integer >= 1, got {self.depth!r}")
            if not self.wait_timeout_s > 0:
                raise ValueError(f"wait_timeout_s: must be > 0, got {self.wait_timeout_s}")

    def __init__(self, sampler: NeighborSampler, source: FeatureSource, labels: np.ndarray,
                 config: "Pipeline.Config | None" = None, **fields):
        self.config = config or Pipeline.Config(**fields)
        self.sampler = sampler
        self.source = source
        self.labels = torch.from_numpy(np.asarray(labels)).long()
        self.device = resolve_device(self.config.device)
        self._slots: list[torch.Tensor] = []
        self.last_stats = EpochStats()

    # ------------------------------------------------------------------ api
    def epoch(self, ids: np.ndarray, batch_size: int, *, epoch: int = 0, shuffle: bool = True, shard: bool = True):
        """Iterate over the batches of one epoch of seed nodes ``ids``: PyG ``Data`` objects.

        With several ranks and ``shard``, this rank's share of every global batch (global batches smaller
        than the number of ranks are dropped: every rank makes the same number of steps)."""
        batches = epoch_batches(ids, batch_size, seed=self.sampler.config.seed, epoch=epoch, shuffle=shuffle)
        world = self.config.world_size
        if shard and world > 1:
            batches = [b[self.config.rank::world] for b in batches if len(b) >= world]
        self.source.new_epoch()
        self.sampler.topology.new_epoch()
        if self.config.overlap:
            return self._overlapped(batches, epoch)
        return self._synchronous(batches, epoch)

    # ------------------------------------------------------------- helpers
    # A feature slot is one tensor here; terastack.gnn.hetero_train's pipeline keeps one per node type by
    # overriding _empty_slot, _fill, _slot_bytes and _data.
    def _empty_slot(self):
        return torch.empty(0, self.source.row_len, dtype=self.source.torch_dtype, device=self.device)

    @staticmethod
    def _slot_bytes(slot) -> int:
        return slot.numel() * slot.element_size()

    def _fill(self, batch: SampledBatch, k: int):
        """Gather ``batch``'s feature rows into slot ``k``; returns what ``_data`` takes as ``x``."""
        return self.source.gather(batch.n_id, self._slot(k, batch.num_nodes))

    def _slot(self, k: int, rows: int) -> torch.Tensor:
        slot = self._slots[k]
        if slot.shape[0] < rows:  # grow-only: bounded by the largest batch this slot has held
            slot = torch.empty(int(rows * 1.1) + 1, self.source.row_len, dtype=self.source.torch_dtype,
                               device=self.device)
            self._slots[k] = slot
        return slot[:rows]

    def _sample(self, batch_seeds: np.ndarray, k: int, epoch: int, stats: EpochStats) -> SampledBatch:
        started = time.perf_counter()
        with trace.span(f"sample {k}", track="sample", cat="gnn"):
            batch = self.sampler.sample(batch_seeds, self.sampler.batch_rng(epoch, k), index=k, epoch=epoch)
        stats.sample_seconds += time.perf_counter() - started
        stats.seeds += batch.batch_size
        return batch

    def _gather(self, batch: SampledBatch, slot: int, stats: EpochStats) -> torch.Tensor:
        started = time.perf_counter()
        with trace.span(f"gather {batch.index}", track="gather", cat="gnn", rows=batch.num_nodes):
            x = self._fill(batch, slot)
        stats.gather_seconds += time.perf_counter() - started
        stats.max_rows = max(stats.max_rows, batch.num_nodes)
        return x

    def _data(self, batch: SampledBatch, x: torch.Tensor):
        y = self.labels[torch.from_numpy(batch.n_id)]
        data = batch.to_data(x, y.to(self.device, non_blocking=True))
        if self.device.type != "cpu":
            data.edge_index = data.edge_index.to(self.device, non_blocking=True)
        return data

    def _finish_stats(self, stats: EpochStats) -> None:
        stats.slot_bytes = [self._slot_bytes(s) for s in self._slots]
        self.last_stats = stats

    # --------------------------------------------------------- synchronous
    def _synchronous(self, batches, epoch: int):
        stats = EpochStats()
        if not self._slots:
            self._slots = [self._empty_slot()]
        try:
            for k, seeds in enumerate(batches):
                batch = self._sample(seeds, k, epoch, stats)
                x = self._gather(batch, 0, stats)
                stats.batches += 1
                yield self._data(batch, x)
        finally:
            self._finish_stats(stats)

    # ---------------------------------------------------------- overlapped
    def _overlapped(self, batches, epoch: int):
        cfg = self.config
        stats = EpochStats()
        nslots = cfg.depth + 2
        while len(self._slots) < nslots:
            self._slots.append(self._empty_slot())
        sampled: queue.Queue = queue.Queue(cfg.depth)
        ready: queue.Queue = queue.Queue(cfg.depth)
        free: queue.Queue = queue.Queue()
        for k in range(nslots):
            free.put(k)
        stop = threading.Event()
        failure: list = []  # (stage, batch, exception) of the first failure

        def put(q: queue.Queue, item, what: str) -> bool:
            deadline = time.monotonic() + cfg.wait_timeout_s
            while not stop.is_set():
                try:
                    q.put(item, timeout=_POLL)
                    return True
                except queue.Full:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"pipeline: waited {cfg.wait_timeout_s:g} s to hand on {what}") from None
            return False

        def get(q: queue.Queue, what: str):
            deadline = time.monotonic() + cfg.wait_timeout_s
            while not stop.is_set():
                try:
                    return q.get(timeout=_POLL)
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"pipeline: waited {cfg.wait_timeout_s:g} s for {what}") from None
            return _END

        def fail(q: queue.Queue, stage: str, k, exc: BaseException) -> None:
            # The failure travels down the queues in order, like the end marker: the caller first gets
            # every batch before the failed one, then the error.
            failure.append((stage, k, exc))
            try:
                if put(q, _Failure(stage, k, exc), f"the {stage} stage's error"):
                    return
            except TimeoutError:
                pass
            stop.set()  # downstream is stuck too: stop everything; the caller's wait reports it

        def sample_loop() -> None:
            k = None
            try:
                for k, seeds in enumerate(batches):
                    if stop.is_set() or not put(sampled, self._sample(seeds, k, epoch, stats), f"sampled batch {k}"):
                        return
                put(sampled, _END, "the end of the epoch")
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fail(sampled, "sampling", k, exc)

        def gather_loop() -> None:
            k = None
            try:
                while True:
                    batch = get(sampled, "the sampling stage")
                    if batch is _END or isinstance(batch, _Failure):
                        put(ready, batch, "the end of the epoch")
                        return
                    k = batch.index
                    slot = get(free, f"a free feature slot for batch {k} (training holds them all)")
                    if slot is _END:
                        return
                    x = self._gather(batch, slot, stats)
                    if not put(ready, (batch, x, slot), f"gathered batch {k}"):
                        return
            except BaseException as exc:  # noqa: BLE001
                fail(ready, "gathering", k, exc)

        threads = [threading.Thread(target=sample_loop, name="terastack-gnn-sample", daemon=True),
                   threading.Thread(target=gather_loop, name="terastack-gnn-gather", daemon=True)]
        for t in threads:
            t.start()
        held = None
        error = None
        try:
            while True:
                waited = time.perf_counter()
                item = get(ready, f"batch {stats.batches} from the gather stage")
                stats.stall_seconds += time.perf_counter() - waited
                if held is not None:
                    free.put(held)  # the caller is done with the previous batch's slot
                    held = None
                if isinstance(item, _Failure):
                    raise PipelineError(item.stage, item.batch, item.exc) from item.exc
                if item is _END:
                    if failure:
                        stage, k, exc = failure[0]
                        raise PipelineError(stage, k, exc) from exc
                    break
                batch, x, held = item
                stats.batches += 1
                yield self._data(batch, x)
        except GeneratorExit:
            raise  # the caller closed the iterator early: just stop the stages (finally)
        except BaseException as exc:
            error = exc
            if failure and not isinstance(exc, PipelineError):
                stage, k, first = failure[0]
                raise PipelineError(stage, k, first) from first
            raise
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=cfg.wait_timeout_s)
            alive = [t.name for t in threads if t.is_alive()]
            self._finish_stats(stats)
            if alive and error is None:  # never mask the error that is already propagating
                raise TimeoutError(f"pipeline: stage threads {alive} did not stop within {cfg.wait_timeout_s:g} s")
