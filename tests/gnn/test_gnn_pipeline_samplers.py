"""Several sampler threads: the same batches in the same order as the synchronous loop, failures in order."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from terastack.gnn.storage.baselines import InMemoryFeatures
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.pipeline import Pipeline, PipelineError
from terastack.gnn.sampling.sampler import NeighborSampler


class JitterSampler(NeighborSampler):
    """Batches sampled by thread 0 (k % samplers == 0) take longer, so the other threads run ahead: a pipeline
    that handed batches on in the order they were sampled would deliver them out of order. Also counts how many
    batches are sampled at once."""

    def __init__(self, *args, samplers: int, fail_at: int | None = None, **kw):
        super().__init__(*args, **kw)
        self.samplers, self.fail_at = samplers, fail_at
        self.lock = threading.Lock()
        self.active = self.most_active = 0

    def sample(self, seeds, rng, *, index=0, epoch=0):
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if index == self.fail_at:
                raise OSError(5, f"simulated EIO sampling batch {index}")
            time.sleep(0.03 if index % self.samplers == 0 else 0.002)
            return super().sample(seeds, rng, index=index, epoch=epoch)
        finally:
            with self.lock:
                self.active -= 1


def _pipeline_threads():
    return [t for t in threading.enumerate() if t.name.startswith("terastack-gnn")]


def _batches(pipe, ids, batch_size, epoch):
    return [(d.n_id.clone(), d.edge_index.clone(), d.x.clone(), d.y.clone(), d.batch_size)
            for d in pipe.epoch(ids, batch_size, epoch=epoch)]


@pytest.mark.parametrize("samplers", [2, 3])
@pytest.mark.parametrize("topology", ["memory", "ssd"])
def test_several_samplers_give_the_synchronous_batches_in_order(tiny, samplers, topology):
    mem = open_dataset(tiny)
    features = torch.from_numpy(mem.read_features())
    train = mem.splits["train"]
    ref_sampler = NeighborSampler(mem.indptr, mem.indices, fanouts=(5, 3), seed=4)
    ref = _batches(Pipeline(ref_sampler, InMemoryFeatures(features), mem.labels, overlap=False), train, 40, 1)
    ds = open_dataset(tiny, topology=topology, indptr="ssd") if topology == "ssd" else mem
    try:
        if topology == "ssd":  # some lists cached, the rest read, in the same hop and from several threads
            ds.topology.fill(np.random.default_rng(2).choice(ds.num_nodes, 300, replace=False))
        sampler = JitterSampler(topology=ds.topology, fanouts=(5, 3), seed=4, samplers=samplers)
        pipe = Pipeline(sampler, InMemoryFeatures(features), mem.labels, samplers=samplers, depth=2)
        got = _batches(pipe, train, 40, 1)
        assert len(got) == len(ref) == -(-len(train) // 40) > 2 * samplers
        for k, ((n1, e1, x1, y1, b1), (n2, e2, x2, y2, b2)) in enumerate(zip(got, ref)):
            assert torch.equal(n1, n2) and torch.equal(e1, e2), k
            assert torch.equal(x1, x2) and torch.equal(y1, y2) and b1 == b2, k
        assert pipe.last_stats.seeds == len(train) and pipe.last_stats.batches == len(ref)
        assert sampler.most_active >= 2  # the threads did sample at once
        if topology == "ssd":
            stats = ds.topology.stats.snapshot()
            assert stats["hits"] > 0 and stats["misses"] > 0 and stats["indices_calls"] > 0
    finally:
        if ds is not mem:
            ds.close()
    assert not _pipeline_threads()


def test_a_failing_sampler_among_several_fails_after_every_earlier_batch(tiny):
    ds = open_dataset(tiny)
    features = torch.from_numpy(ds.read_features())
    # batch 4 is sampler 1's (of 3): it fails at once, while sampler 0's batch 3 is still sleeping
    sampler = JitterSampler(ds.indptr, ds.indices, fanouts=(5, 3), seed=4, samplers=3, fail_at=4)
    pipe = Pipeline(sampler, InMemoryFeatures(features), ds.labels, samplers=3, wait_timeout_s=600)
    seen = []
    with pytest.raises(PipelineError, match=r"sampling stage failed at batch 4: OSError") as info:
        for d in pipe.epoch(ds.splits["train"], 32):
            seen.append(d.n_id.clone())
    assert info.value.stage == "sampling" and info.value.batch == 4 and isinstance(info.value.__cause__, OSError)
    ref = Pipeline(NeighborSampler(ds.indptr, ds.indices, fanouts=(5, 3), seed=4), InMemoryFeatures(features),
                   ds.labels, overlap=False)
    expected = [d.n_id.clone() for d, _ in zip(ref.epoch(ds.splits["train"], 32), range(4))]
    assert len(seen) == 4 and all(torch.equal(a, b) for a, b in zip(seen, expected))
    assert not _pipeline_threads()


def test_more_samplers_than_batches_and_config_errors(tiny):
    ds = open_dataset(tiny)
    features = torch.from_numpy(ds.read_features())
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=(3,), seed=0)
    ids = ds.splits["train"][:50]
    got = [d.n_id.clone() for d in Pipeline(sampler, InMemoryFeatures(features), ds.labels, samplers=4).epoch(ids, 32)]
    ref = [d.n_id.clone() for d in Pipeline(sampler, InMemoryFeatures(features), ds.labels,
                                            overlap=False).epoch(ids, 32)]
    assert len(got) == len(ref) == 2 and all(torch.equal(a, b) for a, b in zip(got, ref))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="samplers"):
            Pipeline.Config(samplers=bad)
    assert not _pipeline_threads()
