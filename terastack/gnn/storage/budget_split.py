"""Dividing one memory budget among feature rows and neighbour lists, by SSD bytes saved per byte.

[Note: splitting one budget between topology and features]
Both caches exist to save SSD reads, so memory goes where a byte of it saves
the most bytes read per epoch, measured by the pre-sampling pass
(terastack.gnn.sampling.hotness): ``c_v`` = times node v's feature row was gathered,
``x_v`` = times v was expanded (its in-neighbour list sampled), ``d_v`` its
in-degree, ``s`` the index itemsize, ``F`` the largest fanout::

    feature row of v:  density_f(v) = c_v * B_row / row_bytes
                       B_row = blocks_per_miss(row_bytes) * 4096    (one row miss reads its covering blocks)
    list of v:         density_t(v) = x_v * (B_list(d_v) + B_ptr) / (d_v * s + 24)
                       B_list(d) = 4096 * min(1 + (d - 1) * s / 4096, min(d, F))
                                   (blocks a list of d entries spans, at most one per drawn entry)
                       B_ptr = 4096 if indptr is on the SSD else 0  (the list's indptr entries; so
                               with indptr on the SSD even an empty list is worth caching)
                       24 bytes: the cached list's id, start and offset

Candidates of both kinds are merged by density, highest first, and taken while
they fit the budget (the greedy answer to this fractional knapsack, and the
reasoning of the TPC model: throughput per unit of cost, here SSD bytes saved
per byte of memory); whatever the lists leave goes to feature rows in hotness
order. Block sharing between misses of one request makes both savings upper
bounds, biased alike. Short lists of often-expanded nodes come first (a 10-entry
list costs 64 bytes and saves a whole 4 KiB block per expansion); hub lists,
thousands of entries for two or three blocks saved, come last.

[Note: one budget over node types and relations]
The host budget pays first for what must be in memory (every featured type's lookup table, 4 bytes per
node, and every relation's indptr when held in memory); the rest goes by the greedy of [Note: splitting one
budget between topology and features] over every candidate at once: each node type's rows (``row_bytes(t)``
each) and, with the topology on the SSD, each relation's lists (``x_v`` counting how often v, of the
relation's destination type, was expanded). Each type's cache (terastack.gnn.storage.cache.UnifiedCache)
gets the bytes its rows won and places its hottest rows; the device budget is divided the same way among
rows only. A homogeneous graph is the one-type, one-relation case.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from terastack.constants import BLOCK
from terastack.gnn.storage.topology import LIST_OVERHEAD, SsdTopology
from terastack.plan.tpc import blocks_per_miss


def list_read_bytes(deg: np.ndarray, itemsize: int, max_fanout: int) -> np.ndarray:
    """SSD bytes one expansion of a node with in-degree ``deg`` reads for its list (``B_list`` of the Note)."""
    deg = np.asarray(deg, dtype=np.float64)
    spanned = 1.0 + np.maximum(deg - 1, 0) * itemsize / BLOCK
    return np.where(deg > 0, BLOCK * np.minimum(spanned, np.minimum(deg, max_fanout)), 0.0)


@dataclass(slots=True)
class ListPart:
    """One relation's candidate lists for :func:`split_budget_parts` (see the Note for the terms)."""

    expansions: np.ndarray
    degrees_of: object
    index_itemsize: int
    max_fanout: int
    indptr_on_ssd: bool


@dataclass(slots=True)
class FeaturePart:
    """One node type's candidate feature rows for :func:`split_budget_parts`."""

    counts: np.ndarray
    row_bytes: int
    read_bytes: int


@dataclass(slots=True)
class PartsSplit:
    """Per list part: the nodes whose lists are cached and their bytes; per feature part: the bytes its rows
    won; and the predicted SSD bytes each part saves per pre-sampled pass."""

    lists: dict
    list_bytes: dict
    feature_bytes: dict
    list_saved: dict
    feature_saved: dict


def split_budget_parts(budget: int, *, lists: dict, features: dict) -> PartsSplit:
    """Divide ``budget`` bytes among the lists of several relations and the feature rows of several node types
    by SSD bytes saved per byte, one greedy over all of them together
    (see [Note: splitting one budget between topology and features])."""
    dens, costs, index, saved_all = [], [], [], []
    for name, part in lists.items():
        expanded = np.flatnonzero(part.expansions > 0)
        deg = np.asarray(part.degrees_of(expanded), np.int64) if len(expanded) else np.zeros(0, np.int64)
        # an empty list saves nothing unless indptr is on the SSD: then caching it (24 bytes) saves its indptr read
        keep = (deg > 0) | part.indptr_on_ssd
        expanded, deg = expanded[keep], deg[keep]
        saved = part.expansions[expanded] * (list_read_bytes(deg, part.index_itemsize, part.max_fanout)
                                             + (BLOCK if part.indptr_on_ssd else 0))
        cost = deg * part.index_itemsize + LIST_OVERHEAD
        dens.append(saved / cost)
        costs.append(cost)
        index.append(("list", name, expanded))
        saved_all.append(saved)
    for name, part in features.items():
        rows = np.flatnonzero(part.counts > 0)
        saved = part.counts[rows] * float(part.read_bytes)
        dens.append(saved / part.row_bytes)
        costs.append(np.full(len(rows), part.row_bytes, np.int64))
        index.append(("features", name, rows))
        saved_all.append(saved)
    empty = np.zeros(0)
    density = np.concatenate(dens) if dens else empty
    cost = np.concatenate(costs) if costs else empty.astype(np.int64)
    saved = np.concatenate(saved_all) if saved_all else empty
    order = np.argsort(-density, kind="stable")
    taken = np.zeros(len(cost), bool)
    taken[order[np.cumsum(cost[order]) <= budget]] = True
    out = PartsSplit(lists={}, list_bytes={}, feature_bytes={}, list_saved={}, feature_saved={})
    offset = 0
    for kind, name, ids in index:
        sel = taken[offset: offset + len(ids)]
        part_cost, part_saved = cost[offset: offset + len(ids)], saved[offset: offset + len(ids)]
        if kind == "list":
            out.lists[name] = np.sort(ids[sel])
            out.list_bytes[name] = int(part_cost[sel].sum())
            out.list_saved[name] = float(part_saved[sel].sum())
        else:
            out.feature_bytes[name] = int(part_cost[sel].sum())
            out.feature_saved[name] = float(part_saved[sel].sum())
        offset += len(ids)
    return out


@dataclass(slots=True)
class BudgetSplit:
    """What :func:`share_budget` decided: per featured node type the (device bytes, host bytes) its cache gets
    (the host bytes pay for its lookup table too), and a description of the split."""

    budgets: dict[str, tuple[int, int]]
    info: dict


def share_budget(ds, hot: dict, max_draws: dict, *, host_budget: int, device_budget: int) -> BudgetSplit:
    """Divide the host and device budgets over every featured type's rows and, with the topology on the SSD, every
    relation's lists, and cache the chosen lists in their topologies; see [Note: one budget over node types and
    relations]. ``hot``: the pre-sampled :class:`~terastack.gnn.sampling.hotness.Hotness` per node type;
    ``max_draws``: per relation the most neighbours one hop draws per node (terastack.gnn.sampling.fanouts)."""
    featured = {t: f for t in ds.node_types if (f := ds.node_features(t)) is not None}
    tables = {t: f.num_nodes * (4 if f.num_nodes < 2**31 else 8) for t, f in featured.items()}
    topos = {et: topo for et, topo in ds.topologies.items() if isinstance(topo, SsdTopology)}
    held = sum(topo.memory_bytes for topo in topos.values())  # indptr, where held in memory
    fixed = held + sum(tables.values())
    if host_budget and fixed > host_budget or held > host_budget:
        raise ValueError(f"host_cache: {host_budget} bytes cannot hold the fixed part ({fixed} bytes: lookup tables "
                         f"{sum(tables.values())}, indptr in memory {held}); raise host_cache or read indptr from the "
                         "SSD (indptr='ssd')")
    features = {t: FeaturePart(hot[t].counts, f.row_bytes, blocks_per_miss(f.row_bytes) * BLOCK)
                for t, f in featured.items()}
    lists = {et: ListPart(hot[et[2]].expansions, topo.degrees, topo.index_dtype.itemsize, max_draws[et],
                          not topo.indptr_in_memory) for et, topo in topos.items()}
    host = split_budget_parts(max(0, host_budget - fixed), lists=lists, features=features)
    device = split_budget_parts(device_budget, lists={}, features=features)
    started, read = time.perf_counter(), 0
    for et, topo in topos.items():
        read += topo.fill(host.lists[et])
    # what the greedy left (rows no pass touched) goes to the target's cache, or the first featured type's
    lead = ds.target if ds.target in featured else next(iter(featured), None)
    left_host = max(0, host_budget - fixed) - sum(host.list_bytes.values()) - sum(host.feature_bytes.values())
    left_dev = device_budget - sum(device.feature_bytes.values())
    budgets = {}
    for t in featured:
        dev = device.feature_bytes[t] + (left_dev if t == lead else 0)
        rows = host.feature_bytes[t] + (max(0, left_host) if t == lead else 0)
        budgets[t] = (dev, rows + tables[t] if rows or dev else 0)
    info = {"feature_bytes": {t: host.feature_bytes[t] for t in featured},
            "device_feature_bytes": {t: device.feature_bytes[t] for t in featured},
            "list_bytes": {"___".join(et): b for et, b in host.list_bytes.items()},
            "lists": {"___".join(et): int(len(v)) for et, v in host.lists.items()},
            "saved_bytes": {**{t: v for t, v in host.feature_saved.items()},
                            **{"___".join(et): v for et, v in host.list_saved.items()}},
            "fixed_bytes": fixed, "indptr_bytes": held, "fill_bytes_read": read,
            "fill_seconds": time.perf_counter() - started}
    return BudgetSplit(budgets, info)
