"""Heterogeneous GNN models from unmodified PyG parts: ``to_hetero(GraphSAGE)`` and R-GCN (``RGCNConv``).

Both take a sampled ``HeteroData``'s ``x_dict`` and ``edge_index_dict`` -- what PyG's own loader gives
these models -- and return the logits of the target type's nodes. Another model goes through the same
seam: any module with that ``forward`` and a ``config`` dict (what rebuilds it) trains and saves alike
(terastack.gnn.training.models: one step, one checkpoint for both graph kinds).

* ``sage``: ``to_hetero(GraphSAGE((-1, -1), hidden, layers, out), metadata, aggr="sum")``: one SAGEConv
  per relation and layer, summed per destination type (PyG's heterogeneous conversion, as in its
  ogbn-mag examples). Every type that sends messages must also receive some (else to_hetero has no
  input for it at the next layer): import with reverse edges (``--undirected``, PyG's ``ToUndirected``).
* ``rgcn``: a linear map of every type's features to ``hidden``, then ``layers`` ``RGCNConv`` over the
  graph made homogeneous (types concatenated in sorted order, one relation id per edge type), as PyG's
  R-GCN examples do; a type that receives nothing keeps its own (root) term.

Types without stored features get a constant feature of width 1 (terastack.gnn.storage.features).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from terastack.gnn.settings import HETERO_MODELS


def check_depth(kind: str, kinds: tuple[str, ...], num_layers: int, what: str) -> None:
    """Raise ValueError naming the field unless ``kind`` is one of ``kinds`` and there is at least one layer."""
    if kind not in kinds:
        raise ValueError(f"model: {what or 'must be '}one of {', '.join(kinds)}; got {kind!r}")
    if num_layers < 1:
        raise ValueError(f"num_layers: must be >= 1, got {num_layers}")


class HeteroGNN(torch.nn.Module):
    """Logits of ``target``'s nodes from ``(x_dict, edge_index_dict)``; see the module docstring."""

    def __init__(self, kind: str, node_types: list[str], edge_types: list[tuple[str, str, str]],
                 in_dims: dict[str, int], hidden: int, out_dim: int, num_layers: int, target: str, *,
                 dropout: float = 0.0):
        super().__init__()
        check_depth(kind, HETERO_MODELS, num_layers, "heterogeneous graphs train ")
        node_types, edge_types = sorted(node_types), sorted(tuple(et) for et in edge_types)
        receives = {et[2] for et in edge_types}
        if target not in receives:
            raise ValueError(f"target: no relation leads into {target!r}, so a GNN cannot compute it from neighbours")
        self.kind, self.target, self.dropout = kind, target, dropout
        self.node_types, self.edge_types = node_types, edge_types
        #: what a checkpoint needs to rebuild the model
        self.config = {"kind": kind, "node_types": node_types, "edge_types": [list(et) for et in edge_types],
                       "in_dims": {t: int(in_dims[t]) for t in node_types}, "hidden": hidden, "out_dim": out_dim,
                       "num_layers": num_layers, "target": target, "dropout": dropout, "hetero": True}
        if kind == "sage":
            from torch_geometric.nn import GraphSAGE, to_hetero

            silent = sorted({et[0] for et in edge_types} - receives)
            if silent and num_layers > 1:
                raise ValueError(f"model sage: node types {silent} send messages but receive none, so to_hetero has "
                                 "no input for them after the first layer; import the dataset with reverse edges "
                                 "(--undirected, as PyG's ToUndirected) or train rgcn")
            base = GraphSAGE((-1, -1), hidden, num_layers, out_channels=out_dim, dropout=dropout)
            self.net = to_hetero(base, (node_types, edge_types), aggr="sum")
            self._materialize(in_dims)
        else:
            from torch_geometric.nn import RGCNConv

            self.inputs = torch.nn.ModuleDict({t: torch.nn.Linear(in_dims[t], hidden) for t in node_types})
            dims = [hidden] * num_layers + [out_dim]
            self.convs = torch.nn.ModuleList(RGCNConv(dims[i], dims[i + 1], len(edge_types)) for i in range(num_layers))

    @torch.no_grad()
    def _materialize(self, in_dims: dict[str, int]) -> None:
        """Run one empty batch so the lazy (-1) input sizes become real parameters before an optimizer sees them."""
        x = {t: torch.zeros(1, in_dims[t]) for t in self.node_types}
        ei = {et: torch.zeros(2, 0, dtype=torch.long) for et in self.edge_types}
        self.net(x, ei)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> torch.Tensor:
        x_dict = {t: x.float() for t, x in x_dict.items()}
        if self.kind == "sage":
            return self.net(x_dict, {et: edge_index_dict[et] for et in self.edge_types})[self.target]
        offsets, start = {}, 0
        for t in self.node_types:
            offsets[t] = start
            start += x_dict[t].shape[0]
        h = torch.cat([self.inputs[t](x_dict[t]) for t in self.node_types])
        parts = [edge_index_dict[et] + torch.tensor([[offsets[et[0]]], [offsets[et[2]]]], device=h.device)
                 for et in self.edge_types]
        edge_index = torch.cat(parts, dim=1)
        edge_type = torch.cat([torch.full((p.shape[1],), i, dtype=torch.long, device=h.device)
                               for i, p in enumerate(parts)])
        for i, conv in enumerate(self.convs):
            h = conv(h, edge_index, edge_type)
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), p=self.dropout, training=self.training)
        lo = offsets[self.target]
        return h[lo: lo + x_dict[self.target].shape[0]]
