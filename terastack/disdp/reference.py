"""The reference every distributed result is checked against: single-process AdamW on the global batch."""
from __future__ import annotations

import torch

from terastack.disdp.workload import ModelSpec, build_model, global_batch, loss_of


def train_single_process(spec: ModelSpec, *, steps: int, seed: int, rows: int, lr: float = 1e-3,
                         betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                         weight_decay: float = 0.01, micro_batches: int = 1) -> tuple[dict[str, torch.Tensor],
                                                                                      list[float]]:
    """Parameters (by name) after ``steps`` steps of plain PyTorch AdamW (fp32), and the losses.

    ``micro_batches=1``: one backward over the whole global batch. ``micro_batches=W``:
    the global batch is processed as W equal micro-batches whose gradients are
    summed and divided by W (gradient accumulation) — the same arithmetic a
    data-parallel job does, so only the order of fp32 additions can differ.
    [Note: fp32 noise floor] AdamW divides by sqrt(v): on parameters whose
    gradient is tiny, the rounding difference between one backward over 16 rows
    and two over 8 rows grows to ~1e-5 within 10 steps at lr 1e-3 — the same for
    every data-parallel system (FSDP2 included), so comparisons at that scale
    use the accumulated reference.
    """
    model = build_model(spec, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    losses = []
    if rows % micro_batches:
        raise ValueError(f"micro_batches: {micro_batches} does not divide the global batch of {rows} rows")
    mb = rows // micro_batches
    for step in range(steps):
        batch = global_batch(spec, step=step, seed=seed, rows=rows)
        opt.zero_grad(set_to_none=True)
        if micro_batches == 1:
            loss = loss_of(model, batch)
            loss.backward()
            losses.append(float(loss.detach()))
        else:
            sums, step_losses = None, []
            for w in range(micro_batches):
                model.zero_grad(set_to_none=True)
                loss = loss_of(model, batch[w * mb:(w + 1) * mb])
                loss.backward()
                step_losses.append(float(loss.detach()))
                grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
                sums = grads if sums is None else [a.add_(g) for a, g in zip(sums, grads)]
            for p, g in zip(model.parameters(), sums):
                p.grad = g.div_(micro_batches)
            losses.append(sum(step_losses) / micro_batches)
        opt.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}, losses


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    missing = set(a) ^ set(b)
    if missing:
        raise ValueError(f"parameter sets differ: {sorted(missing)[:5]}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
