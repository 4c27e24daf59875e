"""Pre-sampling: how often each node's features are touched, and what a cache of k rows would catch.

Hyperion's static cache is placed from access counts gathered by running the
sampler ahead of training. The pass uses its own random stream (seed offset),
never the training batches themselves, so the cache is placed from the access
*distribution*, as it would be for epochs not yet sampled.

[Note: hotness ranking and its hit-rate curve]
Nodes are ranked by pre-sampled access count, ties (notably the many nodes
never touched by the pre-sampling pass) broken by how many in-neighbour lists
they appear in (their chance of being sampled at all), then by id. The curve
"fraction of accesses served by the k top-ranked rows" is estimated out of
sample: the ranking comes from all pre-sampled epochs but the last, and is
scored on the last one. Scoring a ranking on the accesses it was built from
would promise a 100% hit rate as soon as the cache holds every node that one
pass happened to touch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from terastack.gnn.sampling.sampler import NeighborSampler, epoch_batches

#: added to the training seed for the pre-sampling pass
PRESAMPLE_SEED_OFFSET = 7_919


def rank_nodes(counts: np.ndarray, degree: np.ndarray) -> np.ndarray:
    """Node ids hottest first; see [Note: hotness ranking and its hit-rate curve]."""
    # In place, one int64 per node besides the result: on a graph larger than memory these are the pass's
    # largest temporaries.
    score = counts.astype(np.int64)
    score *= -(int(degree.max(initial=0)) + 1)
    score -= degree
    return np.argsort(score, kind="stable")


@dataclass(slots=True)
class Hotness:
    """Access counts from pre-sampling plus the per-batch shape of the workload."""

    # per-node arrays are int32 (4 bytes per node each: on a graph larger than memory they are what the
    # pass itself holds); counts are bounded by the batches sampled
    counts: np.ndarray          # int32 [num_nodes]: times each row was gathered, all pre-sampled epochs
    #: int32 [num_nodes]: times each node's in-neighbour list was sampled (it was in a hop's frontier),
    #: all pre-sampled epochs (what a cached list saves; terastack.gnn.storage.topology)
    expansions: np.ndarray
    degree: np.ndarray          # int32 [num_nodes] (int64 past 2^31): in-neighbour lists each node appears in
    holdout_counts: np.ndarray | None  # the last epoch's counts (the curve is scored on them)
    batches: int                # batches sampled
    epochs: int
    nodes_per_batch: float      # mean rows gathered per batch
    edges_per_batch: float
    seeds_per_batch: float
    sample_seconds_per_batch: float
    #: a few sampled batches kept for calibrating compute (see terastack.plan.tpc)
    examples: list
    _curve: tuple | None = None

    def order(self) -> np.ndarray:
        """Node ids hottest first: the placement order of the unified cache."""
        return rank_nodes(self.counts, self.degree)

    def curve(self, points: int = 513) -> tuple[np.ndarray, np.ndarray]:
        """(rows cached, fraction of accesses they serve) at ``points`` cache sizes from 0 to all rows."""
        if self._curve is None:
            if self.holdout_counts is not None:
                ranking = rank_nodes(self.counts - self.holdout_counts, self.degree)
                scored = self.holdout_counts[ranking]
            else:
                scored = self.counts[rank_nodes(self.counts, self.degree)]
            cum = np.concatenate([[0.0], np.cumsum(scored, dtype=np.float64)])
            self._curve = cum / max(cum[-1], 1.0)
        cum = self._curve
        ks = np.unique(np.linspace(0, len(cum) - 1, points).astype(np.int64))
        return ks, cum[ks]

    def hit_rate(self, rows: int) -> float:
        """Estimated fraction of accesses served by a cache of the ``rows`` top-ranked rows."""
        self.curve()
        cum = self._curve
        return float(cum[int(np.clip(rows, 0, len(cum) - 1))])


def presample(sampler: NeighborSampler, train_ids: np.ndarray, batch_size: int, *, epochs: int = 2,
              seed: int = 0, keep_examples: int = 4, degree: np.ndarray | None = None) -> Hotness:
    """Run the sampler over ``epochs`` epochs of ``train_ids`` and count accesses per node."""
    if epochs < 1:
        raise ValueError(f"epochs: pre-sampling needs at least one epoch, got {epochs}")
    n = sampler.num_nodes
    counts = np.zeros(n, np.int32)
    expansions = np.zeros(n, np.int32)
    last = None
    nodes = edges = seeds = batches = 0
    examples = []
    sampling = 0.0
    for epoch in range(epochs):
        touched = []  # counted once per epoch: one bincount over the epoch's ids, not one per batch
        for k, ids in enumerate(epoch_batches(train_ids, batch_size, seed=seed + PRESAMPLE_SEED_OFFSET, epoch=epoch)):
            t0 = time.perf_counter()
            batch = sampler.sample(ids, np.random.default_rng([seed + PRESAMPLE_SEED_OFFSET, epoch, k]))
            sampling += time.perf_counter() - t0
            touched.append(batch.n_id)
            # every node but those first reached at the last hop had its list sampled (n_id has no repeats)
            expansions[batch.n_id[: batch.num_nodes - batch.num_sampled_nodes[-1]]] += 1
            nodes += batch.num_nodes
            edges += len(batch.row)
            seeds += batch.batch_size
            batches += 1
            if len(examples) < keep_examples:
                examples.append(batch)
        epoch_counts = np.bincount(np.concatenate(touched), minlength=n) if touched else np.zeros(n, np.int64)
        counts += epoch_counts  # in place: no int32 copy of a per-node array
        if epoch == epochs - 1 and epochs > 1:
            last = epoch_counts.astype(np.int32)
        del epoch_counts, touched
    if degree is None:  # streamed: the topology may be memory-mapped or on the SSD, larger than memory
        degree = sampler.topology.appearance_counts()
        if degree.max(initial=0) < 2**31:
            degree = degree.astype(np.int32)
    b = max(batches, 1)
    return Hotness(counts=counts, expansions=expansions, degree=degree, holdout_counts=last, batches=batches, epochs=epochs,
                   nodes_per_batch=nodes / b, edges_per_batch=edges / b, seeds_per_batch=seeds / b,
                   sample_seconds_per_batch=sampling / b, examples=examples)
