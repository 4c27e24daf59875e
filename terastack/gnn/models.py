"""GNN models built from unmodified PyG layers (SAGEConv, GCNConv, GATConv).

Nothing here knows about storage: a model takes ``(x, edge_index)`` of a sampled
batch like any PyG model, which is what lets a user bring their own.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

MODELS = ("sage", "gcn", "gat")


class GNN(torch.nn.Module):
    """``num_layers`` message-passing layers with ReLU between them; logits for every node of the batch."""

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, *, heads: int = 4,
                 dropout: float = 0.0):
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv

        if kind not in MODELS:
            raise ValueError(f"model: must be one of {', '.join(MODELS)}; got {kind!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers: must be >= 1, got {num_layers}")
        if kind == "gat" and hidden % heads:
            raise ValueError(f"hidden: must be a multiple of heads ({heads}) for gat, got {hidden}")
        self.kind, self.dropout = kind, dropout
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        convs = []
        for i in range(num_layers):
            last = i == num_layers - 1
            if kind == "sage":
                convs.append(SAGEConv(dims[i], dims[i + 1]))
            elif kind == "gcn":
                convs.append(GCNConv(dims[i], dims[i + 1]))
            else:
                convs.append(GATConv(dims[i], dims[i + 1] if last else dims[i + 1] // heads,
                                     heads=1 if last else heads))
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.relu(x)
                x = F.dropout(x, p=self.dropout, training=self.training)
        return x


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data) -> float:
    """One step on the seeds of ``data`` (the first ``batch_size`` nodes). Returns the loss."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(data.x.float(), data.edge_index)[: data.batch_size]
    loss = F.cross_entropy(out, data.y[: data.batch_size])
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def eval_step(model: torch.nn.Module, data) -> tuple[int, int]:
    """(correct, total) predictions on the seeds of ``data``."""
    model.eval()
    pred = model(data.x.float(), data.edge_index)[: data.batch_size].argmax(dim=-1)
    return int((pred == data.y[: data.batch_size]).sum()), int(data.batch_size)
