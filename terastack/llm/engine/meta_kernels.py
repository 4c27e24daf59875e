"""The kernels a unit runs on the meta device during the profile pass, chosen as training would choose them.

[Note: the profile's kernels are training's kernels]
The profile (:mod:`terastack.llm.engine.profile`) measures a unit's FLOPs and the bytes its autograd graph saves
by running it on meta tensors. Two ops take a different kernel there than in training, and each difference is a
wrong figure, so :class:`MetaKernels` routes them while the profile runs:

- **Attention.** ``scaled_dot_product_attention`` dispatches by device. On meta it has no fused kernel and takes
  the math path, which saves the heads x tokens x tokens probabilities for backward; the CPU's flash kernel (and
  a GPU's) saves only the output and one log-sum-exp a row. At 1.1B with 256 tokens that is 14.7 MB against 8.4
  MB a layer, and the planner priced activations 30% over what training swapped. The mode asks torch which
  kernel the CPU would take for these shapes and, where that is flash attention, runs the CPU flash op on the
  meta tensors (it has meta kernels forward and backward). ``FlopCounterMode`` has no formula for that op, so
  :func:`register_flop_formulas` gives it torch's own attention formulas.
- **Mixture of experts.** transformers 5 runs stacked expert weights through ``torch.nn.functional.grouped_mm``
  (``config._experts_implementation == "grouped_mm"``, its default; the CPU kernel takes fp32). torch's meta
  kernel of ``_grouped_mm`` accepts bf16 only ("Expected inputs of BF16 type"), so for meta fp32 inputs the
  mode calls transformers' own fallback op (``transformers::grouped_mm_fallback``: the same result shape, the
  same tensors saved for backward, a registered fake kernel), whose FLOPs are counted by formulas registered
  here too.

Training and calibration run on real tensors, which the mode leaves alone.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

_GROUPED_MM = tuple(f for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None))
                    if f is not None)
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
_REGISTERED = False


class MetaKernels(torch.overrides.TorchFunctionMode):
    """Routes meta-device attention and grouped matmuls to the kernels training runs (see the note above)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            routed = _flash_attention_on_meta(args, kwargs)
            if routed is not None:
                return routed
        elif func in _GROUPED_MM and len(args) >= 2 and _meta_fp32(args[0], args[1]) \
                and kwargs.get("bias") is None and kwargs.get("out_dtype") is None and hasattr(torch.ops, "transformers"):
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            return torch.ops.transformers.grouped_mm_fallback(args[0], args[1], offs=offs)
        return func(*args, **kwargs)


def _flash_attention_on_meta(args, kwargs) -> torch.Tensor | None:
    """The CPU flash kernel's output for meta inputs the CPU would give to flash attention, else None."""
    call = {**_SDPA_DEFAULTS, **dict(zip(_SDPA_ARGS, args)), **kwargs}
    q, k, v, mask = call["query"], call["key"], call["value"], call["attn_mask"]
    if not all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in (q, k, v)):
        return None
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.device.type == "meta"):
        return None
    if _cpu_choice(q, k, v, mask, call) != SDPBackend.FLASH_ATTENTION:
        return None
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, call["dropout_p"], call["is_causal"], attn_mask=mask, scale=call["scale"])
    return out


def _cpu_choice(q, k, v, mask, call) -> SDPBackend:
    """Which kernel the CPU's dispatcher picks for tensors of these shapes, strides, dtypes and flags. The
    stand-ins are uninitialized, so no page of them is touched."""
    def like(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).requires_grad_(t.requires_grad)

    choice = torch._fused_sdp_choice(like(q), like(k), like(v), None if mask is None else like(mask),
                                     call["dropout_p"], call["is_causal"], scale=call["scale"],
                                     enable_gqa=call["enable_gqa"])
    return SDPBackend(choice)


def _meta_fp32(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device.type == "meta"
            and torch.bfloat16 not in (a.dtype, b.dtype))


def register_flop_formulas() -> None:
    """FLOP formulas for the ops :class:`MetaKernels` routes to, which ``FlopCounterMode`` does not know.

    - The CPU flash attention op counts as torch counts its other fused attention kernels.
    - transformers' grouped-mm fallback: (S, K) x (E, K, N) is 2*S*K*N forward, twice that backward (the grads
      of the input and of the weight).
    """
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

    @register_flop_formula(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)
    def _attention(q_shape, k_shape, v_shape, *_, **__) -> int:
        return sdpa_flop_count(q_shape, k_shape, v_shape)

    @register_flop_formula(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _attention_backward(grad_shape, q_shape, k_shape, v_shape, *_, **__) -> int:
        return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)

    try:
        import transformers.integrations.moe  # noqa: F401 - registers the ops
        fwd_op = torch.ops.transformers.grouped_mm_fallback
        bwd_op = torch.ops.transformers.grouped_mm_fallback_backward
    except (ImportError, AttributeError):
        return

    @register_flop_formula(fwd_op)
    def _fwd(a_shape, b_shape, *_, **__) -> int:
        return 2 * math.prod(a_shape) * b_shape[-1]

    @register_flop_formula(bwd_op)
    def _bwd(a_shape, b_shape, *_, **__) -> int:
        return 4 * math.prod(a_shape) * b_shape[-1]
