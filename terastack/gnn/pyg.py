"""The dataset as a PyG remote backend: ``FeatureStore`` + ``GraphStore``, and a ``BaseSampler``.

With these, PyG's own loader runs over terastack's storage::

    from torch_geometric.loader import NodeLoader
    fs = TerastackFeatureStore(cache, labels=ds.labels)      # features from the unified cache + SSD
    gs = CSCGraphStore(ds.indptr, ds.indices)
    loader = NodeLoader((fs, gs), node_sampler=PygNeighborSampler(sampler), input_nodes=train, batch_size=1024)

PyG asks the feature store for a batch's rows with one ``multi_get_tensor``
call, which becomes one gather (cache hits + one batched SSD read).
:class:`terastack.gnn.sampling.pipeline.Pipeline` does the same work overlapped.
"""
from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput

from terastack.gnn.storage.cache import FeatureSource
from terastack.gnn.sampling.sampler import NeighborSampler


def _ids(index, num_nodes: int) -> np.ndarray:
    if index is None:
        return np.arange(num_nodes, dtype=np.int64)
    if isinstance(index, slice):
        return np.arange(*index.indices(num_nodes), dtype=np.int64)
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    ids = np.asarray(index, dtype=np.int64).ravel()
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        raise IndexError(f"index: node ids must be in 0..{num_nodes - 1}")
    return ids


class TerastackFeatureStore(FeatureStore):
    """Read-only feature store: ``x`` from a :class:`FeatureSource` (the unified cache), ``y`` from labels."""

    def __init__(self, source: FeatureSource, *, num_nodes: int, labels: np.ndarray | None = None):
        super().__init__()
        self.__dict__["source"] = source
        self.__dict__["num_nodes"] = num_nodes
        self.__dict__["labels"] = None if labels is None else torch.from_numpy(np.asarray(labels)).long()

    def _get_tensor(self, attr: TensorAttr):
        ids = _ids(attr.index, self.num_nodes)
        if attr.attr_name == "x":
            out = torch.empty(len(ids), self.source.row_len, dtype=self.source.torch_dtype)
            return self.source.gather(ids, out)
        if attr.attr_name == "y" and self.labels is not None:
            return self.labels[torch.from_numpy(ids)]
        return None

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise ValueError("TerastackFeatureStore is read-only: write datasets with `terastack gnn gen` or `import`")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ValueError("TerastackFeatureStore is read-only")

    def _get_tensor_size(self, attr: TensorAttr):
        if attr.attr_name == "x":
            return (self.num_nodes, self.source.row_len)
        if attr.attr_name == "y" and self.labels is not None:
            return (self.num_nodes,)
        return None

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        attrs = [TensorAttr(group_name=None, attr_name="x")]
        if self.labels is not None:
            attrs.append(TensorAttr(group_name=None, attr_name="y"))
        return attrs


class CSCGraphStore(GraphStore):
    """Read-only graph store over the dataset's CSC arrays (no copy); COO is derived on request."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray):
        super().__init__()
        self.__dict__["indptr"] = indptr
        self.__dict__["indices"] = indices
        self.__dict__["num_nodes"] = len(indptr) - 1

    def _attr(self) -> EdgeAttr:
        return EdgeAttr(edge_type=None, layout="csc", is_sorted=True, size=(self.num_nodes, self.num_nodes))

    def _get_edge_index(self, edge_attr: EdgeAttr):
        row = torch.as_tensor(np.asarray(self.indices, dtype=np.int64))
        colptr = torch.as_tensor(np.asarray(self.indptr, dtype=np.int64))
        layout = edge_attr.layout.value
        if layout == "csc":
            return row, colptr
        if layout == "coo":
            col = torch.repeat_interleave(torch.arange(self.num_nodes), colptr.diff())
            return row, col
        raise ValueError(f"layout: the dataset stores CSC; {layout!r} is not provided (use 'csc' or 'coo')")

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        raise ValueError("CSCGraphStore is read-only")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise ValueError("CSCGraphStore is read-only")

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [self._attr()]


class PygNeighborSampler(BaseSampler):
    """terastack's :class:`NeighborSampler` behind PyG's ``BaseSampler`` interface (for ``NodeLoader``)."""

    def __init__(self, sampler: NeighborSampler, *, seed: int | None = None):
        self.sampler = sampler
        self.rng = np.random.default_rng(sampler.config.seed if seed is None else seed)

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs) -> SamplerOutput:
        seeds = index.node.cpu().numpy()
        batch = self.sampler.sample(seeds, self.rng)
        return SamplerOutput(node=torch.from_numpy(batch.n_id), row=torch.from_numpy(batch.row),
                             col=torch.from_numpy(batch.col), edge=None,
                             num_sampled_nodes=batch.num_sampled_nodes, num_sampled_edges=batch.num_sampled_edges,
                             metadata=(index.input_id, index.time))

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError("edge-level (link prediction) sampling is not provided by terastack.gnn")
