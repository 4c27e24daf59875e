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
from dataclasses import dataclass, field

import numpy as np

from terastack.gnn.sampling.sampler import NeighborSampler, epoch_batches
from terastack.gnn.storage.topology import appearance_counts

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


class _TypeTally:
    """One node type's counts over a pre-sampling pass (a homogeneous graph has one type)."""

    def __init__(self, num_nodes: int):
        self.counts = np.zeros(num_nodes, np.int32)
        self.expansions = np.zeros(num_nodes, np.int32)
        self.last: np.ndarray | None = None
        self.touched: list[np.ndarray] = []  # this epoch's ids: one bincount per epoch, not one per batch
        self.nodes = 0

    def add(self, n_id: np.ndarray, reached_last: int) -> None:
        """A batch's ids of this type; every node but the ``reached_last`` first reached at the last hop had its
        list sampled (n_id has no repeats)."""
        self.touched.append(n_id)
        self.expansions[n_id[: len(n_id) - reached_last]] += 1
        self.nodes += len(n_id)

    def end_epoch(self, holdout: bool) -> None:
        n = len(self.counts)
        epoch_counts = np.bincount(np.concatenate(self.touched), minlength=n) if self.touched else np.zeros(n, np.int64)
        self.counts += epoch_counts  # in place: no int32 copy of a per-node array
        if holdout:
            self.last = epoch_counts.astype(np.int32)
        self.touched = []


@dataclass(slots=True)
class _Pass:
    """What a pre-sampling pass counted besides the per-type tallies."""

    epochs: int
    batches: int = 0
    seeds: int = 0
    edges: int = 0
    sampling: float = 0.0
    examples: list = field(default_factory=list)

    def hotness(self, tally: _TypeTally, degree: np.ndarray) -> Hotness:
        b = max(self.batches, 1)
        return Hotness(counts=tally.counts, expansions=tally.expansions, degree=degree, holdout_counts=tally.last,
                       batches=self.batches, epochs=self.epochs, nodes_per_batch=tally.nodes / b,
                       edges_per_batch=self.edges / b, seeds_per_batch=self.seeds / b,
                       sample_seconds_per_batch=self.sampling / b, examples=self.examples)


def presample(sampler: NeighborSampler, train_ids: np.ndarray, batch_size: int, *, epochs: int = 2, seed: int = 0,
              keep_examples: int = 4) -> dict[str, Hotness]:
    """Run the sampler over ``epochs`` epochs of ``train_ids`` with the pass's own random stream and count, per
    node type, the feature gathers and the list expansions (for every relation into the type, whose lists a
    frontier node has sampled): one :class:`Hotness` per type (a homogeneous graph's one type, ``node``)."""
    if epochs < 1:
        raise ValueError(f"epochs: pre-sampling needs at least one epoch, got {epochs}")
    tallies = {t: _TypeTally(n) for t, n in sampler.node_counts.items()}
    run = _Pass(epochs=epochs)
    for epoch in range(epochs):
        for k, ids in enumerate(epoch_batches(train_ids, batch_size, seed=seed + PRESAMPLE_SEED_OFFSET, epoch=epoch)):
            t0 = time.perf_counter()
            batch = sampler.sample(ids, np.random.default_rng([seed + PRESAMPLE_SEED_OFFSET, epoch, k]))
            run.sampling += time.perf_counter() - t0
            for t, n_id in batch.nodes.items():
                tallies[t].add(n_id, batch.nodes_per_hop[t][-1])
            run.edges += sum(len(r) for r in batch.rows.values())
            run.seeds += batch.batch_size
            run.batches += 1
            if len(run.examples) < keep_examples:
                run.examples.append(batch)
        for tally in tallies.values():
            tally.end_epoch(holdout=epoch == epochs - 1 and epochs > 1)
    degree = appearance_degrees(sampler.node_counts, sampler.topology.parts)
    return {t: run.hotness(tally, degree[t]) for t, tally in tallies.items()}


def appearance_degrees(node_counts: dict[str, int], topologies: dict) -> dict[str, np.ndarray]:
    """Per node type, how many in-neighbour lists each node appears in, over every relation it is a source of
    (streamed: the topology may be memory-mapped or on the SSD, larger than memory); int32 where it fits."""
    degree: dict[str, np.ndarray] = {}
    for et, topo in topologies.items():  # one int64 count per node at a time: the pass's largest temporaries
        counts = appearance_counts(topo.indices, node_counts[et[0]])
        if et[0] in degree:
            degree[et[0]] += counts
        else:
            degree[et[0]] = counts
    return {t: (d.astype(np.int32) if d.max(initial=0) < 2**31 else d) if (d := degree.get(t)) is not None
            else np.zeros(n, np.int32) for t, n in node_counts.items()}


def degree_hotness(node_counts: dict[str, int], topologies: dict) -> dict[str, Hotness]:
    """Per node type, rows counted by the lists they appear in and no list worth caching: the hotness of a pass
    that reads every neighbourhood (full-neighbourhood inference), made without sampling."""
    out = {}
    for t, degree in appearance_degrees(node_counts, topologies).items():
        out[t] = Hotness(counts=degree, expansions=np.zeros(len(degree), np.int32), degree=degree,
                         holdout_counts=None, batches=0, epochs=0, nodes_per_batch=0.0, edges_per_batch=0.0,
                         seeds_per_batch=0.0, sample_seconds_per_batch=0.0, examples=[])
    return out
