"""The offloaded optimizer's math: AdamW over gathered chunks in one call, and global-norm clipping.

Everything here is torch's own arithmetic (``torch.optim.adam.adam`` with
``decoupled_weight_decay=True`` is AdamW; the clip coefficient is computed as
``torch.nn.utils.clip_grad_norm_`` does), so that results equal plain PyTorch
training; where the tensors come from and go to is
:mod:`terastack.llm.engine.optimizer_state`'s.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class ChunkState(NamedTuple):
    """One optimizer chunk gathered for its update: the flat range ``[lo, hi)`` of tensor ``name`` (chunk
    ``chunk``) and its host tensors, updated in place."""

    name: str
    chunk: int
    lo: int
    hi: int
    param: torch.Tensor       # fp32 master (a view of the whole master, or the master chunk)
    grad: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor


def adamw_kwargs(impl: str, device: torch.device) -> dict:
    """foreach/fused flags for torch's functional Adam (``decoupled_weight_decay=True`` is AdamW)."""
    if impl == "fused" or (impl == "auto" and _fused_supported(device)):
        return {"fused": True, "foreach": False}
    if impl == "foreach":
        return {"fused": False, "foreach": True}
    return {"fused": False, "foreach": False}


_FUSED: dict[str, bool] = {}


def _fused_supported(device: torch.device) -> bool:
    if device.type not in _FUSED:
        from torch.optim.adam import adam

        p = torch.zeros(4, device=device)
        try:
            adam([p], [torch.zeros_like(p)], [torch.zeros_like(p)], [torch.zeros_like(p)], [],
                 [torch.zeros((), device=device)], fused=True, foreach=False, decoupled_weight_decay=True,
                 amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.0, eps=1e-8, maximize=False)
            _FUSED[device.type] = True
        except (RuntimeError, TypeError):
            _FUSED[device.type] = False
    return _FUSED[device.type]


def adamw_update(chunks: list[ChunkState], steps: list[int], *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, impl: dict) -> None:
    """One AdamW step over ``chunks`` in one call (``steps``: each chunk's tensor's step count before it;
    ``impl``: :func:`adamw_kwargs`)."""
    from torch.optim.adam import adam

    with torch.no_grad():
        adam([c.param for c in chunks], [c.grad for c in chunks], [c.exp_avg for c in chunks],
             [c.exp_avg_sq for c in chunks], [], [torch.tensor(float(s)) for s in steps],
             decoupled_weight_decay=True, amsgrad=False, beta1=betas[0], beta2=betas[1], lr=lr,
             weight_decay=weight_decay, eps=eps, maximize=False, **impl)


def total_norm(norms: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of per-tensor gradient norms (in parameter order), as ``clip_grad_norm_`` computes it;
    0 when no gradient arrived."""
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(norms), 2)


def clip_coefficient(total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor every gradient is scaled by: ``min(1, max_norm / (total + 1e-6))``."""
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)
