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
from dataclasses import dataclass

import numpy as np

from terastack.gnn.sampling.fanouts import parse_relation_fanouts
from terastack.gnn.sampling.sampler import sample_relations, thread_maps
from terastack.gnn.storage.topology import TopologyStats

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

    def sample(self, seeds, rng: np.random.Generator, *, index: int = 0, epoch: int = 0) -> HeteroSampledBatch:
        n_id, rows, cols, per_hop, edges = sample_relations(
            thread_maps(self._local, self.num_nodes), self.topology.parts, self.fanouts, self.target, seeds, rng,
            replace=self.config.replace)
        return HeteroSampledBatch(n_id=n_id, row=rows, col=cols, target=self.target, batch_size=per_hop[self.target][0],
                                  num_sampled_nodes=per_hop, num_sampled_edges=edges, index=index, epoch=epoch)
