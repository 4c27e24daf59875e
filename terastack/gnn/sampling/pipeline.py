"""The training pipeline: sampling batch k+2, gathering batch k+1, training batch k, all at once.

[Note: pipeline schedule]
One loop per stage, each in its own thread except training (the caller's loop):

    sampler thread i: for k = i, i+S, ...: sample(k) -> sampled queue i
    gather thread:   for k: take sampled(k) from queue k mod S, a free slot, begin gather(k) into it,
                     finish gather(k-1) -> ready queue (capacity `depth`)
    caller:          for k: take ready(k), train(k), give its slot back

Prologue: the sampler runs ahead while the gather thread fills the first slot;
the caller's first ``next()`` waits for batch 0. Steady state: with depth 1 the
sampler is at k+2 while gather is at k+1 and training is at k. Epilogue: the
sampler sends an end marker through the queues; the caller drains and joins.

Memory is bounded: ``depth + 3`` feature slots exist (one trained on, ``depth``
ready, one being cut, one whose reads are in flight: terastack.gnn.storage.cache
[Note: one batch's reads in flight while the last is cut]), each grown only to the largest batch it has held,
and at most ``depth + S - 1`` sampled batches wait. A batch's ``x`` is a view of its
slot and is valid until the caller asks for the next batch (clone it to keep it). A slot holds one tensor
per node type (a homogeneous graph has one); every type's reads of a batch are submitted before any is
waited for. An epoch resumed at batch j (``start``) numbers its batches from j, as the whole epoch would.

[Note: several sampler threads]
With the topology on the SSD a sampler waits for one read per hop, so one
sampler thread spends most of a batch waiting, not computing
(terastack.plan.tpc [Note: the epoch-time model]). ``samplers`` = S > 1 runs S
sampler threads, thread i sampling batches i, i+S, i+2S, ...: while one waits
for its hop's reads another computes, and their reads are in the disk's queue
together. A batch is the same whichever thread samples it (its random stream
comes from ``NeighborSampler.batch_rng(epoch, k)``, the global -> local id map is
per thread, the SSD topology gives each read its own staging buffer, counters
add under a lock). Order is restored without a reorder buffer: each sampler
hands its batches to a queue of its own (capacity ``ceil(depth / S)``) and the
gather thread takes batch k from queue k mod S, so batches reach gathering and
the caller strictly in order. A sampler that is ahead blocks on its own full
queue only; the one the gather thread waits on always has room, so nothing
deadlocks. A failure goes into its sampler's queue in place of that batch and
so reaches the caller after every earlier batch. The per-node map costs 4 bytes
per node of the graph per sampler thread (192 MB each at 48M nodes).

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

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from terastack import trace
from terastack.gnn.sampling.sampler import NeighborSampler, SampledBatch, epoch_batches
from terastack.gnn.storage.cache import FeatureSource, Gathering, resolve_device
from terastack.gnn.storage.features import TypedFeatures

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
    #: several sampler threads add to sample_seconds (summed over them: thread time, not wall time) and seeds
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


def resolve_samplers(requested: int, topology) -> int:
    """Sampler threads for a pipeline over ``topology``: ``requested`` if > 0, else 2 with the topology (any of a
    heterogeneous graph's relations) on the SSD, where a sampler mostly waits for its hop reads, and 1 in memory
    (where a second one only contends for the interpreter). See [Note: several sampler threads]."""
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise ValueError(f"samplers: must be an integer >= 0 (0: 2 with the topology on the SSD, else 1), "
                         f"got {requested!r}")
    return requested or (2 if getattr(topology, "kind", "memory") == "ssd" else 1)


class Pipeline:
    """Feeds PyG ``Data`` (``HeteroData``) batches to a training loop from a feature source; see [Note: pipeline schedule]."""

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
        #: (terastack.gnn.training.data_parallel [Note: data-parallel GNN training])
        rank: int = 0
        world_size: int = 1
        #: sampler threads; thread i samples batches i, i+samplers, ... (see [Note: several sampler threads])
        samplers: int = 1

        def __post_init__(self) -> None:
            if not 0 <= self.rank < self.world_size:
                raise ValueError(f"rank: must be in 0..world_size-1 = {self.world_size - 1}, got {self.rank}")
            if not isinstance(self.depth, int) or self.depth < 1:
                raise ValueError(f"depth: must be an integer >= 1, got {self.depth!r}")
            if isinstance(self.samplers, bool) or not isinstance(self.samplers, int) or self.samplers < 1:
                raise ValueError(f"samplers: must be an integer >= 1, got {self.samplers!r}")
            if not self.wait_timeout_s > 0:
                raise ValueError(f"wait_timeout_s: must be > 0, got {self.wait_timeout_s}")

    def __init__(self, sampler: NeighborSampler, source: TypedFeatures | FeatureSource, labels: np.ndarray,
                 config: "Pipeline.Config | None" = None, **fields):
        """``source``: every node type's features (terastack.gnn.storage.features), or the one type's source of a
        homogeneous graph; ``labels``: the target type's."""
        self.config = config or Pipeline.Config(**fields)
        self.sampler = sampler
        self.source = source if isinstance(source, TypedFeatures) else TypedFeatures({sampler.target: source})
        self.labels = torch.from_numpy(np.asarray(labels)).long()
        self.device = resolve_device(self.config.device)
        self._slots: list[dict] = []  # a feature slot: one grow-only tensor per node type
        self.last_stats = EpochStats()

    # ------------------------------------------------------------------ api
    def epoch(self, ids: np.ndarray, batch_size: int, *, epoch: int = 0, shuffle: bool = True, shard: bool = True,
              start: int = 0):
        """Iterate over the batches of one epoch of seed nodes ``ids`` of the target type: PyG ``Data`` (or
        ``HeteroData``) objects, from batch ``start`` on (the ones before are not sampled: a batch depends only
        on the seed, the epoch and its place in it).

        With several ranks and ``shard``, this rank's share of every global batch (global batches smaller
        than the number of ranks are dropped: every rank makes the same number of steps)."""
        batches = epoch_batches(ids, batch_size, seed=self.sampler.config.seed, epoch=epoch, shuffle=shuffle)
        world = self.config.world_size
        if shard and world > 1:
            batches = [b[self.config.rank::world] for b in batches if len(b) >= world]
        self.source.new_epoch()
        self.sampler.topology.new_epoch()
        batches = dict(enumerate(batches))  # batch index -> seeds
        for k in range(min(start, len(batches))):
            del batches[k]
        if self.config.overlap:
            return self._overlapped(batches, epoch)
        return self._synchronous(batches, epoch)

    # ------------------------------------------------------------- helpers
    def _begin_fill(self, batch: SampledBatch, k: int) -> Gathering:
        """Begin gathering ``batch``'s rows into slot ``k``, every type's reads submitted before any is waited for
        (they are in the disk's queue together); ``finish()`` gives the rows per type."""
        slot, begun, x = self._slots[k], {}, {}
        for t, ids in batch.nodes.items():
            src = self.source.sources[t]
            buf = slot.get(t)
            if buf is None or buf.shape[0] < len(ids):  # grow-only: bounded by the largest batch the slot has held
                buf = slot[t] = torch.empty(int(len(ids) * 1.1) + 1, src.row_len, dtype=src.torch_dtype,
                                            device=self.device)
            begun[t] = src.begin(ids, buf[: len(ids)])

        def finish_all() -> None:
            errors = []
            for t, g in begun.items():  # every one, so no cache keeps a gather in flight after a failure
                try:
                    x[t] = g.finish()
                except BaseException as exc:  # noqa: BLE001 -- the first is raised below
                    errors.append(exc)
            if errors:
                raise errors[0]

        return Gathering(x, finish_all)

    def _sample(self, batch_seeds: np.ndarray, k: int, epoch: int, stats: EpochStats) -> SampledBatch:
        started = time.perf_counter()
        with trace.span(f"sample {k}", track="sample", cat="gnn"):
            batch = self.sampler.sample(batch_seeds, self.sampler.batch_rng(epoch, k), index=k, epoch=epoch)
        with stats._lock:
            stats.sample_seconds += time.perf_counter() - started
            stats.seeds += batch.batch_size
        return batch

    def _begin_gather(self, batch: SampledBatch, slot: int, stats: EpochStats) -> Gathering:
        started = time.perf_counter()
        with trace.span(f"gather {batch.index}", track="gather", cat="gnn", rows=batch.num_nodes):
            gathering = self._begin_fill(batch, slot)
        stats.gather_seconds += time.perf_counter() - started
        stats.max_rows = max(stats.max_rows, batch.num_nodes)
        return gathering

    def _finish_gather(self, batch: SampledBatch, gathering: Gathering, stats: EpochStats):
        started = time.perf_counter()
        with trace.span(f"cut {batch.index}", track="gather", cat="gnn"):
            x = gathering.finish()
        stats.gather_seconds += time.perf_counter() - started
        return x

    def _data(self, batch: SampledBatch, x: dict):
        y = self.labels[torch.from_numpy(batch.nodes[batch.target])]
        data = batch.to_data(x, y.to(self.device, non_blocking=True))
        if self.device.type != "cpu":
            for store in data.edge_stores:
                store.edge_index = store.edge_index.to(self.device, non_blocking=True)
        return data

    def _finish_stats(self, stats: EpochStats) -> None:
        stats.slot_bytes = [sum(t.numel() * t.element_size() for t in s.values()) for s in self._slots]
        self.last_stats = stats

    # --------------------------------------------------------- synchronous
    def _synchronous(self, batches, epoch: int):
        stats = EpochStats()
        if not self._slots:
            self._slots = [{}]
        try:
            for k, seeds in batches.items():
                batch = self._sample(seeds, k, epoch, stats)
                x = self._finish_gather(batch, self._begin_gather(batch, 0, stats), stats)
                stats.batches += 1
                yield self._data(batch, x)
        finally:
            self._finish_stats(stats)

    # ---------------------------------------------------------- overlapped
    def _overlapped(self, batches, epoch: int):
        cfg = self.config
        stats = EpochStats()
        nslots = cfg.depth + 3  # + the batch whose reads are in flight while the one before is cut
        while len(self._slots) < nslots:
            self._slots.append({})
        stages = _Stages(self, batches, epoch, stats, nslots)
        threads = stages.threads()
        for t in threads:
            t.start()
        held = None
        error = None
        try:
            while True:
                waited = time.perf_counter()
                item = stages.get(stages.ready, f"batch {stats.batches} from the gather stage")
                stats.stall_seconds += time.perf_counter() - waited
                if held is not None:
                    stages.free.put(held)  # the caller is done with the previous batch's slot
                    held = None
                if isinstance(item, _Failure):
                    raise PipelineError(item.stage, item.batch, item.exc) from item.exc
                if item is _END:
                    if stages.failure:
                        stage, k, exc = stages.first_failure()
                        raise PipelineError(stage, k, exc) from exc
                    break
                batch, x, held = item
                stats.batches += 1
                yield self._data(batch, x)
        except GeneratorExit:
            raise  # the caller closed the iterator early: just stop the stages (finally)
        except BaseException as exc:
            error = exc
            if stages.failure and not isinstance(exc, PipelineError):
                stage, k, first = stages.first_failure()
                raise PipelineError(stage, k, first) from first
            raise
        finally:
            stages.stop.set()
            for t in threads:
                t.join(timeout=cfg.wait_timeout_s)
            alive = [t.name for t in threads if t.is_alive()]
            self._finish_stats(stats)
            if alive and error is None:  # never mask the error that is already propagating
                raise TimeoutError(f"pipeline: stage threads {alive} did not stop within {cfg.wait_timeout_s:g} s")


class _Stages:
    """The overlapped epoch's stage threads and what they share: the queues, the stop flag, the failures.

    Sampler thread i samples batches i, i + S, ... into queue i; the gather thread takes them in order,
    keeps one batch's reads in flight while the one before it is finished, and hands batches on in a free
    slot; the caller (:meth:`Pipeline._overlapped`) trains them and gives the slots back. A failure travels
    down the queues in batch order, like the end marker."""

    def __init__(self, pipeline: "Pipeline", batches, epoch: int, stats: EpochStats, nslots: int):
        cfg = pipeline.config
        self.pipeline, self.batches, self.epoch, self.stats = pipeline, batches, epoch, stats
        self.first = min(batches, default=0)  # batch indices run from here (an epoch resumed part way)
        self.timeout_s = cfg.wait_timeout_s
        self.nsamplers = cfg.samplers
        # one queue per sampler thread; batch k is in queue (k - first) % nsamplers ([Note: several sampler threads])
        self.sampled = [queue.Queue(-(-cfg.depth // self.nsamplers)) for _ in range(self.nsamplers)]
        self.ready: queue.Queue = queue.Queue(cfg.depth)
        self.free: queue.Queue = queue.Queue()
        for k in range(nslots):
            self.free.put(k)
        self.stop = threading.Event()
        self.failure: list = []  # (stage, batch, exception) of every stage that failed

    def first_failure(self) -> tuple:
        # the failure of the earliest batch (sampler threads ahead of it may have failed before it did)
        return min(self.failure, key=lambda f: -1 if f[1] is None else f[1])

    def put(self, q: queue.Queue, item, what: str) -> bool:
        deadline = time.monotonic() + self.timeout_s
        while not self.stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pipeline: waited {self.timeout_s:g} s to hand on {what}") from None
        return False

    def get(self, q: queue.Queue, what: str):
        deadline = time.monotonic() + self.timeout_s
        while not self.stop.is_set():
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pipeline: waited {self.timeout_s:g} s for {what}") from None
        return _END

    def fail(self, q: queue.Queue, stage: str, k, exc: BaseException) -> None:
        # The failure travels down the queues in order, like the end marker: the caller first gets
        # every batch before the failed one, then the error.
        self.failure.append((stage, k, exc))
        try:
            if self.put(q, _Failure(stage, k, exc), f"the {stage} stage's error"):
                return
        except TimeoutError:
            pass
        self.stop.set()  # downstream is stuck too: stop everything; the caller's wait reports it

    def threads(self) -> list[threading.Thread]:
        n = self.nsamplers
        names = ["terastack-gnn-sample"] if n == 1 else [f"terastack-gnn-sample-{i}" for i in range(n)]
        threads = [threading.Thread(target=self.sample_loop, args=(i,), name=name, daemon=True)
                   for i, name in enumerate(names)]
        threads.append(threading.Thread(target=self.gather_loop, name="terastack-gnn-gather", daemon=True))
        return threads

    def sample_loop(self, i: int) -> None:
        out, batches = self.sampled[i], self.batches
        k = None
        try:
            for k in range(self.first + i, self.first + len(batches), self.nsamplers):
                if self.stop.is_set() or not self.put(
                        out, self.pipeline._sample(batches[k], k, self.epoch, self.stats), f"sampled batch {k}"):
                    return
            self.put(out, _END, "the end of the epoch")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.fail(out, "sampling", k, exc)

    def gather_loop(self) -> None:
        # One batch's gather in flight while the one before it is finished and handed on
        # (terastack.gnn.storage.cache [Note: one batch's reads in flight while the last is cut]). The one in
        # flight is handed on first whenever going on would wait: for a sampled batch or for a free slot (the
        # caller may need this very batch to give a slot back).
        self._k, self._in_flight = None, []  # (batch, slot, gathering) begun, not handed on, oldest first: <= 2
        try:
            self._gather_all()
        except BaseException as exc:  # noqa: BLE001
            error, failed = exc, self._k
            try:  # the batches before the failed one reach the caller first
                while failed is not None and self._in_flight and self._in_flight[0][0].index < failed:
                    if not self._hand_on():
                        return
            except BaseException as older:  # noqa: BLE001 -- an earlier batch failed: name that one
                error, failed = older, self._k
            self.fail(self.ready, "gathering", failed, error)
        finally:
            for _, _, gathering in self._in_flight:  # stopped early: their reads end before the cache is used again
                try:
                    gathering.finish()
                except BaseException:  # noqa: BLE001 -- the stage already stopped or failed
                    pass

    def _hand_on(self) -> bool:
        batch, slot, gathering = self._in_flight.pop(0)
        self._k = batch.index
        return self.put(self.ready, (batch, self.pipeline._finish_gather(batch, gathering, self.stats), slot),
                        f"gathered batch {self._k}")

    def _gather_all(self) -> None:
        in_flight = self._in_flight
        for want in itertools.count(self.first):
            source = self.sampled[(want - self.first) % self.nsamplers]
            if in_flight and source.empty() and not self._hand_on():
                return
            batch = self.get(source, f"the sampling stage (batch {want})")
            if batch is _END or isinstance(batch, _Failure):
                while in_flight:
                    if not self._hand_on():
                        return
                self.put(self.ready, batch, "the end of the epoch")
                return
            if batch.index != want:  # the queues' invariant; a wrong batch must never be trained on silently
                raise RuntimeError(f"pipeline: expected sampled batch {want}, got batch {batch.index}")
            if in_flight and self.free.empty() and not self._hand_on():
                return
            slot = self.get(self.free, f"a free feature slot for batch {want} (training holds them all)")
            if slot is _END:
                return
            self._k = want
            in_flight.append((batch, slot, self.pipeline._begin_gather(batch, slot, self.stats)))
            if len(in_flight) == 2 and not self._hand_on():
                return
