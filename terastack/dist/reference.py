"""The reference every distributed result is checked against: single-process AdamW on the global batch."""
from __future__ import annotations

import torch

from terastack.dist.models import ModelSpec, build_model, global_batch, loss_of


def train_single_process(spec: ModelSpec, *, steps: int, seed: int, rows: int, lr: float = 1e-3,
                         betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                         weight_decay: float = 0.01) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Parameters (by name) after ``steps`` steps of plain PyTorch AdamW (fp32), and the losses."""
    model = build_model(spec, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    losses = []
    for step in range(steps):
        loss = loss_of(model, global_batch(spec, step=step, seed=seed, rows=rows))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {name: p.detach().clone() for name, p in model.named_parameters()}, losses


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    missing = set(a) ^ set(b)
    if missing:
        raise ValueError(f"parameter sets differ: {sorted(missing)[:5]}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
