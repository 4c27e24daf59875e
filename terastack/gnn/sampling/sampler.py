"""Vectorized uniform multi-hop neighbour sampling over every relation of a graph, batches as PyG's.

PyG's own ``NeighborLoader`` needs pyg-lib or torch-sparse, which PyPI does not carry for current PyTorch;
this sampler is written with numpy only and its batches are plain ``torch_geometric.data.Data`` (a
homogeneous graph) or ``HeteroData`` objects, so PyG's layers consume them unchanged.

[Note: sampling semantics]
As in PyG's neighbour sampling (``num_neighbors`` a list, or a dict per edge type): seeds are nodes of the
target type; at hop i, for every relation (src, rel, dst) in sorted order, each node of type dst first
reached at hop i-1 (the seeds at hop 1) gets up to ``fanouts[relation][i-1]`` sampled in-neighbours of type
src (0 skips the relation at that hop, -1 takes every neighbour). A homogeneous graph is the one-type,
one-relation case. Nodes are numbered per type in order of discovery, seeds first
(``n_id[:batch_size] == seeds``). An edge (row, col) means "row is a sampled in-neighbour of col": messages
flow row -> col, as PyG expects. Without replacement a node with degree <= fanout keeps all its neighbours
and one with more gets a uniform random subset of exactly ``fanout`` distinct ones (Floyd's algorithm,
vectorized over nodes: ``fanout`` steps of O(nodes x fanout)); with replacement every node with a neighbour
gets ``fanout`` independent uniform draws (duplicate edges possible, as in PyG). A heterogeneous batch holds
every node type and relation of the dataset, empty ones included, so models built from the dataset's
metadata (``to_hetero``) find every key they expect.

Randomness comes only from the generator passed to :meth:`NeighborSampler.sample`, every relation's draws
from it in a fixed order; :meth:`NeighborSampler.batch_rng` derives it from (seed, epoch, batch), so a batch is
the same whichever thread samples it and in whatever order. The draws depend only on list lengths, so
batches with the topology on the SSD equal batches with it in memory.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from terastack.gnn.sampling.fanouts import parse_fanouts, parse_relation_fanouts
from terastack.gnn.storage.manifest import HOMOGENEOUS_RELATION, NODE, EdgeType
from terastack.gnn.storage.topology import ArrayTopology, Topologies


#: PyG's name of each of a batch's typed fields
_PYG_NAMES = {"n_id": "nodes", "row": "rows", "col": "cols", "num_sampled_nodes": "nodes_per_hop",
              "num_sampled_edges": "edges_per_hop"}


@dataclass(slots=True)
class SampledBatch:
    """One sampled subgraph: per node type its global ids (seeds first), per relation local ``(row, col)``, the
    nodes first reached at each hop per type and the edges sampled at each hop per relation.

    ``n_id``, ``row``, ``col``, ``num_sampled_nodes`` and ``num_sampled_edges`` have PyG's shapes for the graph's
    kind: the one type's array (list) of a homogeneous graph, dicts for a heterogeneous one."""

    nodes: dict[str, np.ndarray]
    rows: dict[EdgeType, np.ndarray]
    cols: dict[EdgeType, np.ndarray]
    nodes_per_hop: dict[str, list[int]]
    edges_per_hop: dict[EdgeType, list[int]]
    target: str
    batch_size: int
    hetero: bool = False
    #: position of this batch in its epoch, and the epoch
    index: int = 0
    epoch: int = 0

    def __getattr__(self, name: str):
        # PyG's names (n_id, row, col, num_sampled_nodes, num_sampled_edges), in its shape for the graph's kind
        field = _PYG_NAMES.get(name)
        if field is None:
            raise AttributeError(f"'SampledBatch' object has no attribute {name!r}")
        per = getattr(self, field)
        return per if self.hetero else next(iter(per.values()))

    @property
    def num_nodes(self) -> int:
        return sum(len(v) for v in self.nodes.values())

    def edge_index(self, edge_type: EdgeType | None = None):
        import torch

        et = edge_type or next(iter(self.rows))
        return torch.from_numpy(np.stack([self.rows[et], self.cols[et]]))

    def to_data(self, x, y=None):
        """A PyG ``Data`` (``x``, ``edge_index``, ``y`` if given, ``n_id``, ``batch_size``, the hop counts) of a
        homogeneous batch, or a ``HeteroData`` of a heterogeneous one: per type ``x`` (``x[type]``), ``n_id`` and
        hop counts, per relation ``edge_index`` and hop counts, the target's ``y`` and ``batch_size``."""
        import torch
        from torch_geometric.data import Data, HeteroData

        if not self.hetero:
            data = Data(x=x[self.target] if isinstance(x, dict) else x, edge_index=self.edge_index(),
                        n_id=torch.from_numpy(self.n_id))
            data.num_sampled_nodes, data.num_sampled_edges = list(self.num_sampled_nodes), list(self.num_sampled_edges)
            store = data
        else:
            data = HeteroData()
            for t, ids in self.nodes.items():
                data[t].x, data[t].n_id = x[t], torch.from_numpy(ids)
                data[t].num_sampled_nodes = list(self.nodes_per_hop[t])
            for et in self.rows:
                data[et].edge_index = self.edge_index(et)
                data[et].num_sampled_edges = list(self.edges_per_hop[et])
            store = data[self.target]
        if y is not None:
            store.y = y
        store.batch_size = self.batch_size
        return data


class NeighborSampler:
    """Uniform neighbour sampler over every relation of a graph; see [Note: sampling semantics]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: one list for every relation ("15,10"; -1: every neighbour), or per relation on a heterogeneous graph
        #: (terastack.gnn.sampling.fanouts)
        fanouts: object = (15, 10)
        replace: bool = False
        seed: int = 0

    def __init__(self, indptr: np.ndarray | None = None, indices: np.ndarray | None = None,
                 config: "NeighborSampler.Config | None" = None, *, topology=None, dataset=None, **fields):
        """Sample over an opened dataset of either kind (``dataset``), or over one relation: a ``topology``
        (terastack.gnn.storage.topology: arrays, or files on the SSD with hot lists cached) or CSC arrays
        ``indptr``/``indices``."""
        self.config = config or NeighborSampler.Config(**fields)
        if dataset is not None:
            topologies, self.node_counts, self.target = dataset.topologies, dict(dataset.node_counts), dataset.target
            self.hetero = dataset.hetero
        else:
            if topology is None:
                if indptr is None or indices is None:
                    raise ValueError("indptr, indices: give the CSC arrays, a topology or a dataset")
                topology = ArrayTopology(indptr, indices)
            topologies, self.node_counts, self.target = {HOMOGENEOUS_RELATION: topology}, {NODE: topology.num_nodes}, NODE
            self.hetero = False
        self.edge_types = sorted(topologies)
        self.fanouts = (parse_relation_fanouts(self.config.fanouts, self.edge_types) if self.hetero
                        else {HOMOGENEOUS_RELATION: parse_fanouts(self.config.fanouts)})
        self.hops = len(next(iter(self.fanouts.values())))
        self.topology = Topologies(topologies)
        self._local = threading.local()  # per-thread global -> local id map, reset after each batch

    def batch_rng(self, epoch: int, index: int) -> np.random.Generator:
        return np.random.default_rng([self.config.seed, epoch, index])

    def sample(self, seeds, rng: np.random.Generator, *, index: int = 0, epoch: int = 0) -> SampledBatch:
        n_id, rows, cols, per_hop, edges = sample_relations(
            thread_maps(self._local, self.node_counts), self.topology.parts, self.fanouts, self.target, seeds, rng,
            replace=self.config.replace, space="the type" if self.hetero else "the graph")
        return SampledBatch(nodes=n_id, rows=rows, cols=cols, nodes_per_hop=per_hop, edges_per_hop=edges,
                            target=self.target, batch_size=per_hop[self.target][0], hetero=self.hetero, index=index,
                            epoch=epoch)


def thread_maps(local: threading.local, num_nodes: dict[str, int]) -> dict[str, np.ndarray]:
    """This thread's global -> local id map per node type (-1: not in the batch), made on first use.

    int32 when ids fit: a map is one per sampling thread and type, 4 bytes per node."""
    maps = getattr(local, "maps", None)
    if maps is None:
        maps = local.maps = {t: np.full(n, -1, np.int32 if n < 2**31 else np.int64) for t, n in num_nodes.items()}
    return maps


def sample_relations(maps: dict[str, np.ndarray], topologies: dict, fanouts: dict, target: str, seeds,
                     rng: np.random.Generator, *, replace: bool, space: str = "the type"):
    """The hops of one batch over every relation: (n_id, row, col, nodes per hop, edges per hop), keyed by node
    type and relation; see [Note: sampling semantics].

    ``maps``: :func:`thread_maps`, all -1 on entry and on return; ``space`` names the seeds' id space in errors.
    """
    seeds = np.asarray(seeds, dtype=np.int64).ravel()
    local, n_target = maps[target], len(maps[target])
    if seeds.size and (seeds.min() < 0 or seeds.max() >= n_target):
        bad = seeds[(seeds < 0) | (seeds >= n_target)][0]
        what = "node" if space == "the graph" else target
        raise ValueError(f"seeds: {what} id {int(bad)} is out of range ({space} has {n_target} nodes)")
    local[seeds] = np.arange(len(seeds))
    if (local[seeds] != np.arange(len(seeds))).any():
        local[seeds] = -1
        raise ValueError("seeds: node ids within a batch must be distinct")
    edge_types = sorted(topologies)
    none = np.zeros(0, np.int64)
    nodes = {t: ([seeds] if t == target else []) for t in maps}
    counts = {t: (len(seeds) if t == target else 0) for t in maps}
    per_hop = {t: [counts[t]] for t in maps}
    edges = {et: [] for et in edge_types}
    rows, cols = {et: [] for et in edge_types}, {et: [] for et in edge_types}
    frontier = {t: (seeds if t == target else none) for t in maps}
    try:
        for h in range(len(next(iter(fanouts.values()))) if fanouts else 0):
            found = {t: [] for t in maps}
            for et in edge_types:
                src, _, dst = et
                fanout = fanouts[et][h]
                if fanout == 0 or not len(frontier[dst]):
                    edges[et].append(0)
                    continue
                tgt, neighbour = sample_hop(topologies[et], frontier[dst], fanout, rng, replace=replace)
                loc = maps[src]
                fresh = neighbour[loc[neighbour] < 0]
                uniq, first = np.unique(fresh, return_index=True)
                new = uniq[np.argsort(first, kind="stable")]  # in order of discovery
                loc[new] = np.arange(counts[src], counts[src] + len(new))
                counts[src] += len(new)
                nodes[src].append(new)
                found[src].append(new)
                rows[et].append(loc[neighbour].astype(np.int64))
                cols[et].append(maps[dst][tgt].astype(np.int64))
                edges[et].append(len(neighbour))
            frontier = {t: np.concatenate(v) if v else none for t, v in found.items()}
            for t in maps:
                per_hop[t].append(len(frontier[t]))
        n_id = {t: np.concatenate(v) if v else none for t, v in nodes.items()}
    finally:
        for t, parts in nodes.items():
            for part in parts:
                maps[t][part] = -1
    return (n_id, {et: np.concatenate(v) if v else none for et, v in rows.items()},
            {et: np.concatenate(v) if v else none for et, v in cols.items()}, per_hop, edges)


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
