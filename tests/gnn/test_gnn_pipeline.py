"""The pipeline: same batches as the synchronous loop, bounded, and it shuts down on errors without hanging."""
from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from terastack import trace
from terastack.gnn.storage.baselines import InMemoryFeatures
from terastack.gnn.storage.cache import UnifiedCache
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.hotness import presample
from terastack.gnn.sampling.pipeline import Pipeline, PipelineError
from terastack.gnn.sampling.sampler import NeighborSampler


@pytest.fixture(scope="module")
def setup(tiny):
    ds = open_dataset(tiny)
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 3), seed=1)
    features = torch.from_numpy(ds.read_features())
    return ds, sampler, features


def _pipeline_threads():
    return [t for t in threading.enumerate() if t.name.startswith("terastack-gnn")]


def test_overlapped_batches_equal_synchronous_and_in_memory(setup):
    ds, sampler, features = setup
    hot = presample(sampler, ds.splits["train"], 64)["node"]
    train = ds.splits["train"]
    with UnifiedCache(ds, hot.order(), device_budget=50 * ds.row_bytes,
                      host_budget=ds.num_nodes * 4 + 200 * ds.row_bytes) as cache:
        over = Pipeline(sampler, cache, ds.labels, depth=1)
        sync = Pipeline(sampler, cache, ds.labels, overlap=False)
        got = [(d.n_id.clone(), d.edge_index.clone(), d.x.clone(), d.y.clone(), d.batch_size)
               for d in over.epoch(train, 64, epoch=2)]
        ref = [(d.n_id.clone(), d.edge_index.clone(), d.x.clone(), d.y.clone(), d.batch_size)
               for d in sync.epoch(train, 64, epoch=2)]
        assert len(got) == len(ref) == -(-len(train) // 64)
        for (n1, e1, x1, y1, b1), (n2, e2, x2, y2, b2) in zip(got, ref):
            assert torch.equal(n1, n2) and torch.equal(e1, e2) and torch.equal(x1, x2) and torch.equal(y1, y2)
            assert torch.equal(x1, features[n1]) and b1 == b2
            assert torch.equal(y1, torch.from_numpy(ds.labels[n1.numpy()]).long())
        # bounded: depth + 3 feature slots (one's reads in flight while the last is cut), none larger than ~1.1x
        # the largest batch
        assert len(over._slots) == 4
        assert max(s["node"].shape[0] for s in over._slots) <= int(over.last_stats.max_rows * 1.1) + 1
    assert not _pipeline_threads()


class FailingSource(InMemoryFeatures):
    def __init__(self, features, fail_at: int):
        super().__init__(features)
        self.fail_at, self.calls = fail_at, 0

    def gather(self, ids, out):
        self.calls += 1
        if self.calls == self.fail_at + 1:
            raise OSError(5, "simulated EIO from the SSD")
        return super().gather(ids, out)


def test_gather_failure_stops_the_pipeline_and_names_the_stage(setup):
    ds, sampler, features = setup
    # the failure must reach the caller through the queues, not by a wait running out: with waits longer than
    # the test's own timeout (pytest-timeout, 300 s), a pipeline that only noticed it on a timeout fails here
    pipe = Pipeline(sampler, FailingSource(features, fail_at=3), ds.labels, wait_timeout_s=600)
    seen = 0
    with pytest.raises(PipelineError, match=r"gathering stage failed at batch 3: OSError") as info:
        for _ in pipe.epoch(ds.splits["train"], 32):
            seen += 1
    assert seen == 3 and info.value.stage == "gathering" and info.value.batch == 3
    assert isinstance(info.value.__cause__, OSError)
    assert not _pipeline_threads()  # joined before the error reached the caller


def test_sampling_failure_is_reported(setup):
    ds, sampler, features = setup
    pipe = Pipeline(sampler, InMemoryFeatures(features), ds.labels)
    bad = np.concatenate([ds.splits["train"][:40], [ds.num_nodes + 1]])
    seen = 0
    with pytest.raises(PipelineError, match="sampling stage failed at batch 1: ValueError.*out of range"):
        for _ in pipe.epoch(bad, 32, shuffle=False):
            seen += 1
    assert seen == 1  # the good batch before the failure was delivered
    assert not _pipeline_threads()


def test_early_exit_and_training_errors_stop_the_threads(setup):
    ds, sampler, features = setup
    pipe = Pipeline(sampler, InMemoryFeatures(features), ds.labels)
    it = pipe.epoch(ds.splits["train"], 16)
    for k, _ in enumerate(it):
        if k == 2:
            break
    it.close()  # what leaving the loop does to an iterator nothing else holds: stops and joins the stages
    assert not _pipeline_threads()
    with pytest.raises(ZeroDivisionError):
        it = pipe.epoch(ds.splits["train"], 16)
        for k, _ in enumerate(it):
            if k == 1:
                1 / 0  # the training step fails
    it.close()
    assert not _pipeline_threads()


class StuckSource(InMemoryFeatures):
    def __init__(self, features):
        super().__init__(features)
        self.release = threading.Event()

    def gather(self, ids, out):
        self.release.wait(30)
        return super().gather(ids, out)


def test_every_wait_times_out_with_a_name(setup):
    ds, sampler, features = setup
    source = StuckSource(features)
    pipe = Pipeline(sampler, source, ds.labels, wait_timeout_s=0.5)
    try:
        # whichever wait expires first names what it waited on (the caller: the gather stage; the
        # sampler: handing on a batch the stuck gather stage never takes)
        with pytest.raises((TimeoutError, PipelineError), match=r"waited 0.5 s (for batch 0 from the gather "
                                                               r"stage|to hand on sampled batch)"):
            for _ in pipe.epoch(ds.splits["train"], 32):
                pass
    finally:
        source.release.set()
    # the stuck stage outlived the pipeline's own join (0.5 s); released, every stage thread ends
    for t in _pipeline_threads():
        t.join(30)
    assert not _pipeline_threads()


def test_config_errors_and_trace_shows_the_three_stages(setup):
    ds, sampler, features = setup
    with pytest.raises(ValueError, match="depth"):
        Pipeline(sampler, InMemoryFeatures(features), ds.labels, depth=0)
    with pytest.raises(ValueError, match="wait_timeout_s"):
        Pipeline.Config(wait_timeout_s=0)
    trace.tracer.start()
    try:
        for k, d in enumerate(Pipeline(sampler, InMemoryFeatures(features), ds.labels).epoch(ds.splits["train"], 64)):
            with trace.span(f"train {k}", track="train"):
                pass
    finally:
        trace.tracer.stop()
    tracks = {e["args"]["name"] for e in trace.tracer.events() if e["ph"] == "M"}
    assert {"sample", "gather", "train"} <= tracks


# ------------------------------------------------- one batch's reads in flight while the one before is cut
class QueuedLog:
    """The pipeline's queues (``module``, put in place of the pipeline's ``queue`` module), recording each sampled
    batch as it is put in its sampler's queue, so a test can wait until the samplers are ahead of the gather thread:
    by events, whatever the machine's load."""

    def __init__(self):
        self._queued: set = set()
        self._cv = threading.Condition()
        log = self

        class Queue(queue.Queue):
            def put(self, item, *args, **kwargs):
                super().put(item, *args, **kwargs)
                index = getattr(item, "index", None)  # a sampled batch (the other queues carry slots and tuples)
                if index is not None:
                    with log._cv:
                        log._queued.add(index)
                        log._cv.notify_all()

        self.module = SimpleNamespace(Queue=Queue, Empty=queue.Empty, Full=queue.Full)

    def wait_for(self, k: int, timeout: float = 30.0) -> None:
        with self._cv:
            assert self._cv.wait_for(lambda: k in self._queued, timeout), f"batch {k} was never queued"


@pytest.fixture
def queued(monkeypatch):
    import terastack.gnn.sampling.pipeline as pipeline

    log = QueuedLog()
    monkeypatch.setattr(pipeline, "queue", log.module)
    return log


class LoggedCache(UnifiedCache):
    """The unified cache, logging when each batch's gather begins and finishes. With ``queued`` (a
    :class:`QueuedLog`) and ``batches``, ``begin(k)`` returns only once batch k+1 has been sampled and put in
    the gather thread's queue: the samplers are ahead (the steady state of an epoch that waits on the disk)."""

    def __init__(self, *args, fail_begin_at: int | None = None, fail_finish_at: int | None = None,
                 queued: QueuedLog | None = None, batches: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.log, self.begun = [], 0
        self.fail_begin_at, self.fail_finish_at = fail_begin_at, fail_finish_at
        self.queued, self.batches = queued, batches

    def begin(self, ids, out):
        k = self.begun
        self.begun += 1
        if k == self.fail_begin_at:
            raise OSError(5, "simulated EIO submitting the reads")
        self.log.append(("begin", k, len(self._in_flight) + 1))
        gathering = super().begin(ids, out)
        if self.queued is not None and k + 1 < self.batches:
            self.queued.wait_for(k + 1)
        cache = self

        class Logged:
            def finish(self):
                if k == cache.fail_finish_at:
                    gathering.finish()
                    raise OSError(5, "simulated EIO reading the blocks")
                out = gathering.finish()
                cache.log.append(("finish", k, len(cache._in_flight)))
                return out
        return Logged()


def _logged(setup, queued: QueuedLog, **kwargs):
    """A :class:`LoggedCache` over the tiny dataset whose batches of 32 are each queued before the gather thread
    looks for them (``queued``: the :class:`QueuedLog` in place)."""
    ds, sampler, _ = setup
    hot = presample(sampler, ds.splits["train"], 64)["node"]
    return LoggedCache(ds, hot.order(), device_budget=0, host_budget=ds.num_nodes * 4 + 100 * ds.row_bytes,
                       queued=queued, batches=-(-len(ds.splits["train"]) // 32), **kwargs)


def test_the_next_batchs_reads_are_in_flight_while_one_is_cut(setup, queued):
    ds, sampler, features = setup
    with _logged(setup, queued) as cache:
        batches = cache.batches
        pipe = Pipeline(sampler, cache, ds.labels)
        got = [(d.n_id.clone(), d.x.clone()) for d in pipe.epoch(ds.splits["train"], 32)]
        assert len(got) == batches >= 8
        for n_id, x in got:  # every row right: the two gathers in flight never shared a staging buffer
            assert torch.equal(x, features[n_id])
        events = cache.log
        assert [k for e, k, _ in events if e == "begin"] == list(range(batches))
        assert [k for e, k, _ in events if e == "finish"] == list(range(batches))  # handed on in order
        # batch k+1 was begun (its reads submitted) before batch k was finished, for every batch but the last:
        # each was sampled before the gather thread looked for it
        position = {(e, k): i for i, (e, k, _) in enumerate(events)}
        overlapped = [k for k in range(batches - 1) if position[("begin", k + 1)] < position[("finish", k)]]
        assert overlapped == list(range(batches - 1))
        assert max(n for e, _, n in events if e == "begin") == 2  # never more than two in flight
        assert not cache._in_flight
        assert cache.stats.snapshot()["batches"] == batches


def test_a_failed_begin_delivers_the_batch_in_flight_then_names_the_failed_one(setup, queued):
    ds, sampler, features = setup
    with _logged(setup, queued, fail_begin_at=3) as cache:
        pipe = Pipeline(sampler, cache, ds.labels, wait_timeout_s=600)
        seen = []
        with pytest.raises(PipelineError, match=r"gathering stage failed at batch 3: OSError.*submitting"):
            for d in pipe.epoch(ds.splits["train"], 32):
                seen.append(d.n_id.clone())
        assert len(seen) == 3  # batch 2, in flight when batch 3's begin failed, reached the caller first
        assert cache.begun == 4 and [k for e, k, _ in cache.log if e == "finish"] == [0, 1, 2]
        assert not cache._in_flight and not _pipeline_threads()


def test_a_failed_finish_names_its_batch_and_the_newer_gather_is_ended(setup, queued):
    ds, sampler, _ = setup
    with _logged(setup, queued, fail_finish_at=2) as cache:
        pipe = Pipeline(sampler, cache, ds.labels, wait_timeout_s=600)
        seen = 0
        with pytest.raises(PipelineError, match=r"gathering stage failed at batch 2: OSError.*reading"):
            for _ in pipe.epoch(ds.splits["train"], 32):
                seen += 1
        assert seen == 2
        # batch 3 was begun before batch 2 failed; the stage ended it, so the cache serves the next epoch
        assert ("begin", 3, 2) in cache.log and not cache._in_flight and not _pipeline_threads()
        cache.fail_finish_at = cache.queued = None
        assert sum(1 for _ in pipe.epoch(ds.splits["train"], 32)) == -(-len(ds.splits["train"]) // 32)


def test_two_gathers_begun_by_hand_finish_in_order_into_their_own_rows(setup):
    ds, sampler, features = setup
    hot = presample(sampler, ds.splits["train"], 64)["node"]
    rng = np.random.default_rng(3)
    with UnifiedCache(ds, hot.order(), device_budget=0, host_budget=ds.num_nodes * 4 + 50 * ds.row_bytes) as cache:
        a, b = (np.sort(rng.choice(ds.num_nodes, 300, replace=False)) for _ in range(2))
        out_a, out_b = torch.empty(300, ds.feat_dim), torch.empty(300, ds.feat_dim)
        first, second = cache.begin(a, out_a), cache.begin(b, out_b)
        done = []
        finisher = threading.Thread(target=lambda: done.append(second.finish()))
        finisher.start()  # waits for the older gather to finish first
        finisher.join(0.2)
        assert finisher.is_alive() and not done
        assert torch.equal(first.finish(), features[a])
        finisher.join(10)
        assert done and torch.equal(done[0], features[b]) and not cache._in_flight
