"""terastack for a PyG user: :class:`NeighborLoader`, PyG's loader over a dataset larger than memory, and
:func:`stores`, the dataset as PyG's ``FeatureStore`` and ``GraphStore``. Both graph kinds (docs/gnn.md, "For a
PyG user", shows them in a training script).

[Note: the loader's batches as PyG's]
``NeighborLoader(data, num_neighbors, input_nodes, batch_size, shuffle, ...)`` takes PyG's arguments, ``data`` a
dataset directory (or an opened :class:`~terastack.gnn.storage.dataset.GraphDataset`), and yields what PyG's
``NeighborLoader`` yields: a ``Data`` (``x``, ``y``, ``edge_index``, ``n_id``, ``num_sampled_nodes``,
``num_sampled_edges``, ``input_id``, ``batch_size``; seeds first) or a ``HeteroData`` (per node type ``x`` -- none
for a type without features, as in PyG -- ``n_id`` and ``num_sampled_nodes``; per edge type ``edge_index``, row
the source type's local ids, and ``num_sampled_edges``; the input type's ``y``, ``input_id``, ``batch_size``),
sampled as PyG samples (terastack.gnn.sampling.sampler [Note: sampling semantics]). The one placement call
(terastack.gnn.graph_placement) pre-samples ``input_nodes``, places the unified cache in ``device_cache`` +
``host_cache``, and its pipeline samples and gathers the next batches on threads (``num_workers`` of them)
while the caller trains on this one; every batch owns its tensors, as PyG's do. No pyg-lib or torch-sparse is
needed. Each pass is the next epoch (``shuffle``: a new order from ``seed``, by default drawn from torch's
generator so that ``torch.manual_seed`` repeats a run).

[Note: the stores]
:func:`stores` gives the dataset to PyG's own loaders (which need pyg-lib to sample): the ``FeatureStore``
reads ``x`` through the unified cache of the placement call (rows ranked by the lists they appear in) and
``y`` from the target type's labels, ``group_name`` the node type (``None`` for a homogeneous graph, as PyG
writes it); the ``GraphStore`` hands each relation's CSC (``edge_type`` ``None`` for a homogeneous graph), or
COO on request. Both are read-only.
"""
from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr

from terastack.gnn.graph_placement import Placement
from terastack.gnn.sampling.sampler import epoch_batches
from terastack.gnn.settings import setting_default
from terastack.gnn.storage.dataset import GraphDataset, open_dataset

def _input_nodes(ds, input_nodes) -> tuple[np.ndarray, np.ndarray]:
    """(seed ids, their ``input_id``) of PyG's ``input_nodes``; see [Note: the loader's batches as PyG's]."""
    node_type, nodes = (input_nodes if isinstance(input_nodes, (tuple, list)) else
                        (input_nodes, None) if isinstance(input_nodes, str) else (ds.target, input_nodes))
    if ds.hetero and not isinstance(input_nodes, (str, tuple, list)):
        raise ValueError(f"input_nodes: a heterogeneous dataset needs the seeds' type, e.g. ({ds.target!r}, ids)")
    if node_type != ds.target:
        raise ValueError(f"input_nodes: seeds must be of the dataset's labelled type {ds.target!r}, got {node_type!r}")
    n = ds.node_counts[ds.target]
    if nodes is None:
        ids = np.arange(n)
        return ids, ids
    nodes = torch.as_tensor(nodes)
    if nodes.dtype == torch.bool:
        if len(nodes) != n:
            raise ValueError(f"input_nodes: a mask needs one entry per {ds.target} node ({n}), has {len(nodes)}")
        ids = nodes.nonzero().view(-1).numpy()
        return ids, ids  # PyG: a mask's input_id are the node ids
    ids = nodes.long().view(-1).numpy()
    if len(ids) and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"input_nodes: node ids must be in 0..{n - 1}")
    return ids, np.arange(len(ids))


class NeighborLoader:
    """PyG's ``NeighborLoader`` over a dataset on the SSD; see [Note: the loader's batches as PyG's]."""

    def __init__(self, data, num_neighbors, input_nodes=None, batch_size: int = 1, shuffle: bool = False, *,
                 replace: bool = False, drop_last: bool = False, transform=None, num_workers: int = 0,
                 device_cache: int | str = setting_default("cache.device_cache"),
                 host_cache: int | str = setting_default("cache.host_cache"), device: str = "cpu",
                 topology: str = setting_default("data.topology"), seed: int | None = None, engine=None, **kwargs):
        if kwargs:  # PyG's temporal, weighted, disjoint or undirected sampling, and DataLoader's worker options
            raise ValueError(f"{next(iter(kwargs))}: not served by terastack's NeighborLoader, which samples PyG's "
                             "directional subgraphs on its own threads (num_workers: how many)")
        self.batch_size, self.shuffle, self.drop_last, self.transform = batch_size, shuffle, drop_last, transform
        self.seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else int(seed)
        self.epoch = 0
        ds = self.data = data if isinstance(data, GraphDataset) else open_dataset(data, topology=topology)
        try:
            self.ids, self.input_id = _input_nodes(ds, input_nodes)
            self.placed = Placement(ds, seeds=self.ids, seed=self.seed, batch_size=batch_size, fanouts=num_neighbors,
                                    replace=replace, device_cache=device_cache, host_cache=host_cache, device=device,
                                    topology=topology, samplers=num_workers, engine=engine)
        except BaseException:
            if ds is not data:
                ds.close()
            raise
        self.placed.owned = ds is not data  # the dataset opened here closes with the loader

    def __len__(self) -> int:
        n = len(self.ids)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        """The batches of the next epoch, made by the pipeline while the caller works on the one before."""
        ds, epoch = self.data, self.epoch
        self.epoch += 1
        positions = epoch_batches(self.input_id, self.batch_size, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        batches = self.placed.pipeline.epoch(self.ids, self.batch_size, epoch=epoch, shuffle=self.shuffle, shard=False)
        featureless = [t for t in ds.node_types if not ds.feature_dims[t]]
        try:
            for k, data in zip(range(len(self)), batches):
                store = data[ds.target] if ds.hetero else data
                for t in featureless:
                    del data[t].x  # PyG gives a type without features none
                for s in data.node_stores:  # the pipeline's slots are reused: a batch owns its rows, as PyG's do
                    if "x" in s:
                        s.x = s.x.clone()
                store.input_id = torch.from_numpy(positions[k])
                yield data if self.transform is None else self.transform(data)
        finally:
            batches.close()

    def close(self) -> None:
        self.placed.close()

    def __enter__(self) -> "NeighborLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



def _ids(index, num_nodes: int) -> np.ndarray:
    if index is None:
        return np.arange(num_nodes, dtype=np.int64)
    if isinstance(index, slice):
        return np.arange(*index.indices(num_nodes), dtype=np.int64)
    ids = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64).ravel()
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        raise IndexError(f"index: node ids must be in 0..{num_nodes - 1}")
    return ids


class TerastackFeatureStore(FeatureStore):
    """Read-only feature store over a placed dataset's feature sources; see [Note: the stores]."""

    def __init__(self, placed: Placement):
        super().__init__()
        self.__dict__["placed"] = placed
        self.__dict__["labels"] = torch.from_numpy(np.asarray(placed.dataset.target_labels)).long()

    def _type(self, group_name) -> str:
        ds = self.placed.dataset
        t = ds.target if group_name is None and not ds.hetero else group_name
        if t not in ds.node_types:
            raise KeyError(f"group_name: {group_name!r} is not a node type of {ds.root} ({', '.join(ds.node_types)})")
        return t

    def _get_tensor(self, attr: TensorAttr):
        ds, t = self.placed.dataset, self._type(attr.group_name)
        ids = _ids(attr.index, ds.node_counts[t])
        if attr.attr_name == "x" and ds.feature_dims[t]:
            source = self.placed.features.sources[t]
            return source.gather(ids, torch.empty(len(ids), source.row_len, dtype=source.torch_dtype))
        if attr.attr_name == "y" and t == ds.target:
            return self.labels[torch.from_numpy(ids)]
        return None

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise ValueError("TerastackFeatureStore is read-only: write datasets with `terastack gnn gen` or `import`")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ValueError("TerastackFeatureStore is read-only")

    def _get_tensor_size(self, attr: TensorAttr):
        ds, t = self.placed.dataset, self._type(attr.group_name)
        n = ds.node_counts[t]
        return (n, ds.feature_dims[t]) if attr.attr_name == "x" and ds.feature_dims[t] else \
            (n,) if attr.attr_name == "y" and t == ds.target else None

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        ds = self.placed.dataset
        group = (lambda t: t) if ds.hetero else (lambda t: None)
        return [TensorAttr(group_name=group(t), attr_name="x") for t in ds.node_types if ds.feature_dims[t]] + \
            [TensorAttr(group_name=group(ds.target), attr_name="y")]


class CSCGraphStore(GraphStore):
    """Read-only graph store over a dataset's relations (CSC, or COO on request); see [Note: the stores]."""

    def __init__(self, ds):
        super().__init__()
        self.__dict__["ds"] = ds

    def _topology(self, edge_type):
        ds = self.ds
        et = next(iter(ds.edge_types)) if edge_type is None and not ds.hetero else tuple(edge_type or ())
        if et not in ds.topologies:
            raise KeyError(f"edge_type: {edge_type!r} is not a relation of {ds.root}")
        return ds.topologies[et]

    def _get_edge_index(self, edge_attr: EdgeAttr):
        topo = self._topology(edge_attr.edge_type)
        row = torch.as_tensor(np.asarray(topo.indices, dtype=np.int64))
        colptr = torch.as_tensor(np.asarray(topo.indptr, dtype=np.int64))
        layout = edge_attr.layout.value
        if layout == "csc":
            return row, colptr
        if layout == "coo":
            return row, torch.repeat_interleave(torch.arange(len(colptr) - 1), colptr.diff())
        raise ValueError(f"layout: the dataset stores CSC; {layout!r} is not provided (use 'csc' or 'coo')")

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        raise ValueError("CSCGraphStore is read-only")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ValueError("CSCGraphStore is read-only")

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        ds = self.ds
        return [EdgeAttr(edge_type=et if ds.hetero else None, layout="csc", is_sorted=True,
                         size=(ds.node_counts[et[0]], ds.node_counts[et[2]])) for et in ds.edge_types]


def stores(data, *, device_cache: int | str = setting_default("cache.device_cache"),
           host_cache: int | str = setting_default("cache.host_cache"),
           topology: str = setting_default("data.topology"), engine=None) -> tuple[FeatureStore, GraphStore]:
    """A PyG ``(FeatureStore, GraphStore)`` over the dataset ``data`` (a directory or an opened dataset), either
    kind; see [Note: the stores]. The feature store's cache is released with ``feature_store.placed.close()``."""
    placed = Placement(data, fanouts=(1,), rank_by="degree", device_cache=device_cache, host_cache=host_cache,
                       device="cpu", topology=topology, engine=engine)
    return TerastackFeatureStore(placed), CSCGraphStore(placed.dataset)
