"""The offloaded optimizer's math besides the format's update: a gathered chunk, torch's AdamW flags, and
global-norm clipping.

The update itself is the optimizer format's (:mod:`terastack.plan.optimizer_formats`: AdamW is
``torch.optim.adam.adam`` with ``decoupled_weight_decay=True``); the clip coefficient is computed as
``torch.nn.utils.clip_grad_norm_`` does, so that results equal plain PyTorch training; where the tensors come
from and go to is :mod:`terastack.llm.engine.optimizer_state`'s.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class ChunkState(NamedTuple):
    """One optimizer chunk gathered for its update: the flat range ``[lo, hi)`` of tensor ``name`` (of ``shape``;
    chunk ``chunk``) and its host tensors, updated in place. ``state``: the optimizer format's state part key ->
    its tensor for this chunk (a part kept for the whole parameter: with the first chunk only)."""

    name: str
    chunk: int
    lo: int
    hi: int
    shape: tuple
    param: torch.Tensor       # fp32 master (a view of the whole master, or the master chunk)
    grad: torch.Tensor
    state: dict


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


def total_norm(norms: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of per-tensor gradient norms (in parameter order), as ``clip_grad_norm_`` computes it;
    0 when no gradient arrived."""
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(norms), 2)


def clip_coefficient(total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor every gradient is scaled by: ``min(1, max_norm / (total + 1e-6))``."""
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)
