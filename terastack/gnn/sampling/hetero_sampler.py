"""Vectorized multi-hop neighbour sampling over a heterogeneous graph, per-relation fanouts, batches as ``HeteroData``.

[Note: heterogeneous sampling semantics]
As PyG's ``NeighborLoader`` on a ``HeteroData`` (``num_neighbors`` a dict per edge type): seeds are nodes
of the target type; at hop i, for every relation (src, rel, dst) in sorted order, each node of type dst
first reached at hop i-1 (the seeds at hop 1) gets up to ``fanouts[relation][i-1]`` sampled in-neighbours
of type src, drawn over that relation's CSC exactly as the homogeneous sampler draws
(terastack.gnn.sampling.sampler [Note: sampling semantics]; 0 skips the relation at that hop, -1 takes every
neighbour). Nodes are numbered per type in order of discovery, seeds first. Every relation's draws come
from the one generator of the batch, in a fixed order, and depend only on list lengths, so batches with
topology on the SSD equal batches with it in memory.

A batch holds every node type and relation of the dataset, empty ones included, so models built from the
dataset's metadata (``to_hetero``) find every key they expect.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from terastack.gnn.sampling.fanouts import parse_relation_fanouts
from terastack.gnn.storage.hotness import PRESAMPLE_SEED_OFFSET, Hotness
from terastack.gnn.sampling.sampler import epoch_batches, sample_hop
from terastack.gnn.storage.topology import TopologyStats, appearance_counts

EdgeType = tuple[str, str, str]


#: per-relation fanouts (the name this module gave terastack.gnn.sampling.fanouts.parse_relation_fanouts)
parse_hetero_fanouts = parse_relation_fanouts


@dataclass(slots=True)
class HeteroSampledBatch:
    """One sampled heterogeneous subgraph: per type global ids (seeds first), per relation local (row, col)."""

    n_id: dict[str, np.ndarray]
    row: dict[EdgeType, np.ndarray]
    col: dict[EdgeType, np.ndarray]
    target: str
    batch_size: int
    num_sampled_nodes: dict[str, list[int]]
    num_sampled_edges: dict[EdgeType, list[int]]
    index: int = 0
    epoch: int = 0

    @property
    def num_nodes(self) -> int:
        return sum(len(v) for v in self.n_id.values())

    @property
    def seeds(self) -> np.ndarray:
        return self.n_id[self.target][: self.batch_size]

    def to_hetero_data(self, x_dict: dict, y=None):
        """A ``torch_geometric.data.HeteroData``: per type ``x``, ``n_id``; per relation ``edge_index``;
        the target's ``y`` (if given) and ``batch_size``."""
        import torch
        from torch_geometric.data import HeteroData

        data = HeteroData()
        for t, ids in self.n_id.items():
            data[t].x = x_dict[t]
            data[t].n_id = torch.from_numpy(ids)
            data[t].num_sampled_nodes = list(self.num_sampled_nodes[t])
        for et in self.row:
            data[et].edge_index = torch.from_numpy(np.stack([self.row[et], self.col[et]]))
            data[et].num_sampled_edges = list(self.num_sampled_edges[et])
        if y is not None:
            data[self.target].y = y
        data[self.target].batch_size = self.batch_size
        return data


class HeteroTopology:
    """Every relation's topology behind the one interface the pipeline and epoch reports use."""

    def __init__(self, topologies: dict):
        self.parts = dict(topologies)

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
        snap = self.stats.snapshot()
        return {**snap, "relations": {"___".join(et): t.describe() for et, t in self.parts.items()},
                "topology": next(iter(self.parts.values())).kind if self.parts else "memory"}


class HeteroNeighborSampler:
    """Uniform neighbour sampler over every relation; see [Note: heterogeneous sampling semantics]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: one list for every relation, or per relation (see :func:`parse_hetero_fanouts`)
        fanouts: object = (15, 10)
        replace: bool = False
        seed: int = 0

    def __init__(self, topologies: dict, num_nodes: dict[str, int], target: str,
                 config: "HeteroNeighborSampler.Config | None" = None, **fields):
        self.config = config or HeteroNeighborSampler.Config(**fields)
        self.edge_types = sorted(topologies)
        self.fanouts = parse_hetero_fanouts(self.config.fanouts, self.edge_types)
        self.hops = len(next(iter(self.fanouts.values()))) if self.fanouts else 0
        self.num_nodes = dict(num_nodes)
        if target not in self.num_nodes:
            raise ValueError(f"target: {target!r} is not a node type ({', '.join(self.num_nodes)})")
        self.target = target
        self.topology = HeteroTopology(topologies)
        self._local = threading.local()

    @classmethod
    def for_dataset(cls, ds, **fields) -> "HeteroNeighborSampler":
        return cls(ds.topologies, ds.num_nodes, ds.target, **fields)

    def batch_rng(self, epoch: int, index: int) -> np.random.Generator:
        return np.random.default_rng([self.config.seed, epoch, index])

    def _maps(self) -> dict[str, np.ndarray]:
        maps = getattr(self._local, "maps", None)
        if maps is None:
            maps = self._local.maps = {t: np.full(n, -1, np.int32 if n < 2**31 else np.int64)
                                       for t, n in self.num_nodes.items()}
        return maps

    def sample(self, seeds, rng: np.random.Generator, *, index: int = 0, epoch: int = 0) -> HeteroSampledBatch:
        seeds = np.asarray(seeds, dtype=np.int64).ravel()
        n_target = self.num_nodes[self.target]
        if seeds.size and (seeds.min() < 0 or seeds.max() >= n_target):
            bad = seeds[(seeds < 0) | (seeds >= n_target)][0]
            raise ValueError(f"seeds: {self.target} id {int(bad)} is out of range (the type has {n_target} nodes)")
        maps = self._maps()
        local = maps[self.target]
        local[seeds] = np.arange(len(seeds))
        if (local[seeds] != np.arange(len(seeds))).any():
            local[seeds] = -1
            raise ValueError("seeds: node ids within a batch must be distinct")
        nodes = {t: [] for t in self.num_nodes}
        nodes[self.target].append(seeds)
        counts = {t: 0 for t in self.num_nodes}
        counts[self.target] = len(seeds)
        per_hop = {t: [len(seeds) if t == self.target else 0] for t in self.num_nodes}
        edges_per_hop = {et: [] for et in self.edge_types}
        rows = {et: [] for et in self.edge_types}
        cols = {et: [] for et in self.edge_types}
        frontier = {t: (seeds if t == self.target else np.zeros(0, np.int64)) for t in self.num_nodes}
        try:
            for hop in range(self.hops):
                found = {t: [] for t in self.num_nodes}
                for et in self.edge_types:
                    src, _, dst = et
                    fanout = self.fanouts[et][hop]
                    if fanout == 0 or not len(frontier[dst]):
                        edges_per_hop[et].append(0)
                        continue
                    target, neighbour = sample_hop(self.topology.parts[et], frontier[dst], fanout, rng,
                                                   replace=self.config.replace)
                    loc = maps[src]
                    fresh = neighbour[loc[neighbour] < 0]
                    uniq, first = np.unique(fresh, return_index=True)
                    new = uniq[np.argsort(first, kind="stable")]
                    loc[new] = np.arange(counts[src], counts[src] + len(new))
                    counts[src] += len(new)
                    nodes[src].append(new)
                    found[src].append(new)
                    rows[et].append(loc[neighbour].astype(np.int64))
                    cols[et].append(maps[dst][target].astype(np.int64))
                    edges_per_hop[et].append(len(neighbour))
                frontier = {t: np.concatenate(v) if v else np.zeros(0, np.int64) for t, v in found.items()}
                for t in self.num_nodes:
                    per_hop[t].append(len(frontier[t]))
            n_id = {t: np.concatenate(v) if v else np.zeros(0, np.int64) for t, v in nodes.items()}
        finally:
            for t, parts in nodes.items():
                for part in parts:
                    maps[t][part] = -1
        empty = np.zeros(0, np.int64)
        return HeteroSampledBatch(
            n_id=n_id, row={et: np.concatenate(v) if v else empty for et, v in rows.items()},
            col={et: np.concatenate(v) if v else empty for et, v in cols.items()}, target=self.target,
            batch_size=len(seeds), num_sampled_nodes=per_hop, num_sampled_edges=edges_per_hop, index=index,
            epoch=epoch)


def hetero_presample(sampler: HeteroNeighborSampler, train_ids: np.ndarray, batch_size: int, *, epochs: int = 2,
                     seed: int = 0, keep_examples: int = 2) -> dict[str, Hotness]:
    """Per node type: feature gathers and list expansions counted over ``epochs`` pre-sampled epochs
    (terastack.gnn.storage.hotness, one :class:`Hotness` per type; its ``expansions`` count for every relation
    into the type, whose lists a frontier node has sampled)."""
    if epochs < 1:
        raise ValueError(f"epochs: pre-sampling needs at least one epoch, got {epochs}")
    counts = {t: np.zeros(n, np.int32) for t, n in sampler.num_nodes.items()}
    expansions = {t: np.zeros(n, np.int32) for t, n in sampler.num_nodes.items()}
    last = {}
    nodes = {t: 0 for t in counts}
    batches = seeds = 0
    sampling = 0.0
    examples = []
    for epoch in range(epochs):
        touched = {t: [] for t in counts}
        for k, ids in enumerate(epoch_batches(train_ids, batch_size, seed=seed + PRESAMPLE_SEED_OFFSET, epoch=epoch)):
            t0 = time.perf_counter()
            batch = sampler.sample(ids, np.random.default_rng([seed + PRESAMPLE_SEED_OFFSET, epoch, k]))
            sampling += time.perf_counter() - t0
            for t, n_id in batch.n_id.items():
                touched[t].append(n_id)
                nodes[t] += len(n_id)
                expanded = len(n_id) - batch.num_sampled_nodes[t][-1]  # all but those first reached last
                expansions[t][n_id[:expanded]] += 1
            seeds += batch.batch_size
            batches += 1
            if len(examples) < keep_examples:
                examples.append(batch)
        for t in counts:
            epoch_counts = np.bincount(np.concatenate(touched[t]), minlength=len(counts[t])) if touched[t] else \
                np.zeros(len(counts[t]), np.int64)
            counts[t] += epoch_counts.astype(np.int32)
            if epoch == epochs - 1 and epochs > 1:
                last[t] = epoch_counts.astype(np.int32)
    degree = {t: np.zeros(n, np.int64) for t, n in sampler.num_nodes.items()}
    for et, topo in sampler.topology.parts.items():  # lists a node appears in, over every relation it is a source of
        degree[et[0]] += appearance_counts(topo.indices, sampler.num_nodes[et[0]])
    b = max(batches, 1)
    return {t: Hotness(counts=counts[t], expansions=expansions[t], degree=degree[t], holdout_counts=last.get(t),
                       batches=batches, epochs=epochs, nodes_per_batch=nodes[t] / b, edges_per_batch=0.0,
                       seeds_per_batch=seeds / b, sample_seconds_per_batch=sampling / b, examples=examples)
            for t in counts}
