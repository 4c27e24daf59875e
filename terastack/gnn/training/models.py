"""GNN models built from unmodified PyG layers, one train and eval step and one checkpoint format for both graph kinds.

Nothing here knows about storage: a homogeneous model (:class:`GNN`: SAGEConv, GCNConv, GATConv) takes
``(x, edge_index)`` of a sampled ``Data`` like any PyG model, which is what lets a user bring their own; a
heterogeneous one (:class:`HeteroGNN`, terastack.gnn.training.hetero_net) takes a sampled ``HeteroData``'s
``x_dict`` and ``edge_index_dict`` and returns its target type's logits. The step, the evaluation and the
checkpoint are written once; the model's ``config`` (what rebuilds it) says which class it is.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from terastack.gnn.settings import MODELS
from terastack.gnn.training.hetero_net import HeteroGNN, check_depth

CHECKPOINT_FORMAT = "terastack-gnn-model"
CHECKPOINT_VERSION = 1
_META_MAX_BYTES = 1 << 20


class GNN(torch.nn.Module):
    """``num_layers`` message-passing layers with ReLU between them; logits for every node of the batch."""

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, *, heads: int = 4,
                 dropout: float = 0.0):
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv

        check_depth(kind, MODELS, num_layers, "")
        if kind == "gat" and hidden % heads:
            raise ValueError(f"hidden: must be a multiple of heads ({heads}) for gat, got {hidden}")
        self.kind, self.dropout = kind, dropout
        #: the constructor's arguments: what a checkpoint needs to rebuild the model (see save_model)
        self.config = {"kind": kind, "in_dim": in_dim, "hidden": hidden, "out_dim": out_dim,
                       "num_layers": num_layers, "heads": heads, "dropout": dropout}
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


def seed_logits(model: torch.nn.Module, data) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(logits, labels, count) of the seeds of a sampled batch: the first ``batch_size`` nodes of a ``Data``, or
    of the model's target type in a ``HeteroData`` (the only difference between the two graph kinds' steps)."""
    from torch_geometric.data import HeteroData

    if not isinstance(data, HeteroData):
        bs = data.batch_size
        return model(data.x.float(), data.edge_index)[:bs], data.y[:bs], int(bs)
    target = getattr(model, "module", model).target  # the model, or the model in DistributedDataParallel
    bs = data[target].batch_size
    return model(data.x_dict, data.edge_index_dict)[:bs], data[target].y[:bs], int(bs)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data) -> float:
    """One step on the seeds of ``data`` (see :func:`seed_logits`). Returns the loss."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out, y, _ = seed_logits(model, data)
    loss = F.cross_entropy(out, y)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def eval_step(model: torch.nn.Module, data) -> tuple[int, int]:
    """(correct, total) predictions on the seeds of ``data``."""
    model.eval()
    out, y, bs = seed_logits(model, data)
    return int((out.argmax(dim=-1) == y).sum()), bs


# ------------------------------------------------------------------ checkpoints
# [Note: model checkpoints]
# A checkpoint is two files: PATH holds the state_dict written by torch.save (read back only with
# torch.load(weights_only=True), so loading runs no code from the file), and PATH.json (checkpoints
# written earlier named it PATH with its suffix replaced; still read) holds what rebuilds the model (GNN's
# constructor arguments), the weights' size and SHA-256, and whatever the caller adds (the training
# configuration, the dataset it was trained on).
# Both are written atomically, the weights first: a JSON file always names complete weights.


def checkpoint_meta_path(path: str | os.PathLike) -> Path:
    """The JSON file beside a checkpoint's weights: their name with ``.json`` added (``model.pt`` ->
    ``model.pt.json``), so ``model.pt`` and ``model.bin`` in one folder do not share one description."""
    path = Path(path)
    if path.suffix == ".json":
        raise ValueError(f"checkpoint: {path} ends in .json, the suffix of a checkpoint's description file; "
                         "give the weights another suffix (e.g. .pt)")
    return path.with_name(path.name + ".json")


def existing_meta_path(path: str | os.PathLike) -> Path:
    """The description to read for the weights at ``path``: :func:`checkpoint_meta_path`, or the name checkpoints
    written before it used (``model.pt`` -> ``model.json``) when only that one exists."""
    meta = checkpoint_meta_path(path)
    legacy = Path(path).with_suffix(".json")
    return legacy if not meta.exists() and legacy.is_file() else meta


def save_model(model: GNN | HeteroGNN, path: str | os.PathLike, **extra) -> Path:
    """Write ``model``'s weights to ``path`` and its description to :func:`checkpoint_meta_path`."""
    from terastack.atomic import atomic_write_bytes, atomic_write_json

    path = Path(path)
    meta_path = checkpoint_meta_path(path)
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buf)
    data = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)
    atomic_write_json(meta_path, {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model": model.config,
                                  "weights": path.name, "bytes": len(data),
                                  "sha256": hashlib.sha256(data).hexdigest(), **extra})
    return path


_GNN_FIELDS = ("kind", "in_dim", "hidden", "out_dim", "num_layers", "heads", "dropout")
_HETERO_FIELDS = ("kind", "node_types", "edge_types", "in_dims", "hidden", "out_dim", "num_layers", "target",
                  "dropout", "hetero")


def load_model(path: str | os.PathLike) -> tuple[GNN | HeteroGNN, dict]:
    """The model saved by :func:`save_model` at ``path`` (on the CPU, in eval mode) and its description: a
    :class:`GNN`, or a :class:`HeteroGNN` when the description says ``hetero``."""
    state, meta = read_checkpoint(path)
    meta_path = existing_meta_path(path)
    cfg = meta.get("model")
    keys = _HETERO_FIELDS if isinstance(cfg, dict) and cfg.get("hetero") else _GNN_FIELDS
    if not isinstance(cfg, dict) or set(cfg) != set(keys):
        raise ValueError(f"{meta_path}: 'model' must have exactly the fields {', '.join(keys)}")
    if keys is _HETERO_FIELDS:
        model = HeteroGNN(cfg["kind"], cfg["node_types"], [tuple(et) for et in cfg["edge_types"]], cfg["in_dims"],
                          cfg["hidden"], cfg["out_dim"], cfg["num_layers"], cfg["target"], dropout=cfg["dropout"])
    else:
        model = GNN(cfg["kind"], cfg["in_dim"], cfg["hidden"], cfg["out_dim"], cfg["num_layers"],
                    heads=cfg["heads"], dropout=cfg["dropout"])
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{path}: weights do not fit the model in {meta_path.name}: {exc}") from None
    return model.eval(), meta


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict]:
    """(state_dict, description) of a checkpoint written by :func:`save_model`, size and SHA-256 checked,
    the weights read with ``torch.load(weights_only=True)``; see [Note: model checkpoints]."""
    from terastack.atomic import safe_relative

    path = Path(path)
    meta_path = existing_meta_path(path)
    for p in (path, meta_path):
        if not p.is_file():
            raise ValueError(f"checkpoint: {p} does not exist (written by `terastack gnn train --save-model`)")
    if meta_path.stat().st_size > _META_MAX_BYTES:
        raise ValueError(f"{meta_path}: {meta_path.stat().st_size} bytes is too large for a checkpoint description")
    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{meta_path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{meta_path}: not a terastack GNN checkpoint description (format != {CHECKPOINT_FORMAT})")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{meta_path}: version {meta.get('version')!r} is not supported ({CHECKPOINT_VERSION})")
    if safe_relative(path.parent, str(meta.get("weights", ""))) != path.resolve():
        raise ValueError(f"{meta_path}: describes weights {meta.get('weights')!r}, not {path.name}")
    data = path.read_bytes()
    if len(data) != meta.get("bytes") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        raise ValueError(f"{path}: size or SHA-256 differs from {meta_path.name} (a damaged or replaced file)")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True), meta
