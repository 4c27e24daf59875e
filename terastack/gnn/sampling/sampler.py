"""Vectorized uniform multi-hop neighbour sampling over CSC.

PyG's own ``NeighborLoader`` needs pyg-lib or torch-sparse, which PyPI does not
carry for current PyTorch; this sampler is written with numpy only and its
batches are plain ``torch_geometric.data.Data`` objects, so ``SAGEConv``,
``GCNConv`` and ``GATConv`` consume them unchanged.

[Note: sampling semantics]
As in PyG's neighbour sampling: hop 1 samples up to ``fanouts[0]`` in-neighbours
of each seed, hop i samples up to ``fanouts[i-1]`` in-neighbours of the nodes
first reached at hop i-1. Nodes are numbered locally in order of discovery,
seeds first (``n_id[:batch_size] == seeds``). An edge (row, col) means "row is a
sampled in-neighbour of col": messages flow row -> col, as PyG expects.
Without replacement a node with degree <= fanout keeps all its neighbours and
one with more gets a uniform random subset of exactly ``fanout`` distinct ones
(Floyd's algorithm, vectorized over nodes: ``fanout`` steps of O(nodes x fanout));
with replacement every node with a neighbour gets ``fanout`` independent uniform
draws (duplicate edges possible, as in PyG).

Randomness comes only from the generator passed to :meth:`sample`;
:meth:`batch_rng` derives it from (seed, epoch, batch), so a batch is the same
whichever thread samples it and in whatever order.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from terastack.gnn.sampling.fanouts import parse_fanouts
from terastack.gnn.storage.topology import ArrayTopology


@dataclass(slots=True)
class SampledBatch:
    """One sampled subgraph. ``n_id`` are global node ids (seeds first); ``row``/``col`` are local ids."""

    n_id: np.ndarray
    row: np.ndarray
    col: np.ndarray
    batch_size: int
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    #: position of this batch in its epoch, and the epoch
    index: int = 0
    epoch: int = 0

    @property
    def num_nodes(self) -> int:
        return len(self.n_id)

    @property
    def seeds(self) -> np.ndarray:
        return self.n_id[: self.batch_size]

    def edge_index(self):
        import torch

        return torch.from_numpy(np.stack([self.row, self.col]))

    def to_data(self, x, y=None):
        """A ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y`` (if given), ``n_id``, ``batch_size``."""
        import torch
        from torch_geometric.data import Data

        data = Data(x=x, edge_index=self.edge_index(), n_id=torch.from_numpy(self.n_id))
        if y is not None:
            data.y = y
        data.batch_size = self.batch_size
        data.num_sampled_nodes = list(self.num_sampled_nodes)
        data.num_sampled_edges = list(self.num_sampled_edges)
        return data


class NeighborSampler:
    """Uniform neighbour sampler over a CSC graph; see [Note: sampling semantics]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        fanouts: tuple[int, ...] = (15, 10)
        replace: bool = False
        seed: int = 0

        def __post_init__(self) -> None:
            self.fanouts = parse_fanouts(self.fanouts)  # strict; -1 takes every neighbour

    def __init__(self, indptr: np.ndarray | None = None, indices: np.ndarray | None = None,
                 config: "NeighborSampler.Config | None" = None, *, topology=None, **fields):
        """Sample over CSC arrays ``indptr``/``indices``, or over a ``topology``
        (terastack.gnn.storage.topology: arrays, or files on the SSD with hot lists cached)."""
        self.config = config or NeighborSampler.Config(**fields)
        if topology is None:
            if indptr is None or indices is None:
                raise ValueError("indptr, indices: give the CSC arrays, or a topology")
            topology = ArrayTopology(indptr, indices)
        self.topology = topology
        self.num_nodes = topology.num_nodes
        self._local = threading.local()  # per-thread global -> local id map, reset after each batch

    @property
    def indptr(self):
        return self.topology.indptr

    @property
    def indices(self):
        return self.topology.indices

    @property
    def fanouts(self) -> tuple[int, ...]:
        return self.config.fanouts

    def batch_rng(self, epoch: int, index: int) -> np.random.Generator:
        return np.random.default_rng([self.config.seed, epoch, index])

    def _map(self) -> np.ndarray:
        local = getattr(self._local, "map", None)
        if local is None:
            # int32 when ids fit: this map is one per sampling thread, 4 bytes per node of the graph
            local = self._local.map = np.full(self.num_nodes, -1, np.int32 if self.num_nodes < 2**31 else np.int64)
        return local

    def sample(self, seeds, rng: np.random.Generator, *, index: int = 0, epoch: int = 0) -> SampledBatch:
        seeds = np.asarray(seeds, dtype=np.int64).ravel()
        if seeds.size and (seeds.min() < 0 or seeds.max() >= self.num_nodes):
            bad = seeds[(seeds < 0) | (seeds >= self.num_nodes)][0]
            raise ValueError(f"seeds: node id {int(bad)} is out of range (the graph has {self.num_nodes} nodes)")
        local = self._map()
        local[seeds] = np.arange(len(seeds))
        if (local[seeds] != np.arange(len(seeds))).any():
            local[seeds] = -1
            raise ValueError("seeds: node ids within a batch must be distinct")
        nodes = [seeds]
        rows, cols = [], []
        num_nodes, num_edges = [len(seeds)], []
        count = len(seeds)
        frontier = seeds
        try:
            for fanout in self.fanouts:
                target, neighbour = self._sample_hop(frontier, fanout, rng)
                loc = local[neighbour]
                fresh = neighbour[loc < 0]
                uniq, first = np.unique(fresh, return_index=True)
                new = uniq[np.argsort(first, kind="stable")]  # in order of discovery
                local[new] = np.arange(count, count + len(new))
                count += len(new)
                rows.append(local[neighbour].astype(np.int64))
                cols.append(local[target].astype(np.int64))
                nodes.append(new)
                num_nodes.append(len(new))
                num_edges.append(len(neighbour))
                frontier = new
            n_id = np.concatenate(nodes)
        finally:
            for part in nodes:
                local[part] = -1
        return SampledBatch(n_id=n_id, row=np.concatenate(rows), col=np.concatenate(cols), batch_size=len(seeds),
                            num_sampled_nodes=num_nodes, num_sampled_edges=num_edges, index=index, epoch=epoch)

    def _sample_hop(self, frontier: np.ndarray, fanout: int, rng: np.random.Generator):
        return sample_hop(self.topology, frontier, fanout, rng, replace=self.config.replace)


def sample_hop(topology, frontier: np.ndarray, fanout: int, rng: np.random.Generator, *, replace: bool = False):
    """(target, neighbour) global id pairs sampled for ``frontier`` over ``topology``; see [Note: sampling semantics].

    The draws depend only on the list lengths; the topology is asked for the
    values at the drawn positions once per hop (one SSD submission when it is
    on the SSD; see terastack.gnn.storage.topology [Note: topology on the SSD]). A
    negative ``fanout`` takes every neighbour (no draws).
    """
    hop = topology.lookup(frontier)
    start, deg = hop.start, hop.deg
    if fanout < 0:  # every neighbour, once: the "keep all" branch below for every node
        fanout, replace = int(deg.max(initial=0)), False
    if replace:
        has = np.flatnonzero(deg > 0)
        rep = np.repeat(has, fanout)
        pos = start[rep] + (rng.random(len(rep)) * deg[rep]).astype(np.int64)
        return frontier[rep], topology.neighbours(hop, rep, pos)
    # nodes with deg <= fanout keep every neighbour
    small = np.flatnonzero((deg > 0) & (deg <= fanout))
    counts = deg[small]
    rep_small = np.repeat(small, counts)
    offs = np.arange(len(rep_small)) - np.repeat(np.cumsum(counts) - counts, counts)
    pos_small = start[rep_small] + offs
    # the rest get exactly `fanout` distinct neighbours (vectorized Floyd)
    big = np.flatnonzero(deg > fanout)
    d = deg[big]
    chosen = np.empty((len(big), fanout), np.int64)
    for i in range(fanout):
        j = d - fanout + i  # Floyd step: draw t in [0, j]; take j instead if t is already chosen
        t = (rng.random(len(big)) * (j + 1)).astype(np.int64)
        seen = (chosen[:, :i] == t[:, None]).any(axis=1) if i else np.zeros(len(big), bool)
        chosen[:, i] = np.where(seen, j, t)
    pos_big = (start[big][:, None] + chosen).ravel()
    owner = np.concatenate([rep_small, np.repeat(big, fanout)])  # the frontier node each position belongs to
    pos = np.concatenate([pos_small, pos_big])
    return frontier[owner], topology.neighbours(hop, owner, pos)


def epoch_batches(ids: np.ndarray, batch_size: int, *, seed: int, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
    """The seed batches of one epoch: ``ids`` shuffled by (seed, epoch) and cut into ``batch_size`` pieces."""
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    ids = np.asarray(ids, dtype=np.int64)
    if shuffle:
        ids = ids[np.random.default_rng([seed, 1_000_003, epoch]).permutation(len(ids))]
    return [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]
