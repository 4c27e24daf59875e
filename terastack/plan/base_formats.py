"""How a frozen LoRA base rests and streams, for the planner: the bytes of each frozen weight in a base format.

[Note: pricing an NF4 base]
With ``lora.base_format: nf4`` the frozen base rests on the store and streams in bitsandbytes' NF4 (the QLoRA
format): two 4-bit codes a byte and one fp32 absmax per block of 64 values (``quantize_4bit``'s default block,
without nested quantization of the absmax), dequantized per unit where the unit computes. As in QLoRA, the
decoder layers' linear weights are quantized; embeddings, norms and the output head stay in the compute
dtype. The planner prices a base format by the bytes each frozen weight takes (:func:`priced_base`); the
dequantization's compute is not priced (a few elementwise passes per weight, small beside its matmuls).
"""
from __future__ import annotations

import dataclasses

from terastack.plan.llm_profile import ModelProfile

#: values per fp32 absmax of bitsandbytes' 4-bit quantization (its ``blocksize`` default)
NF4_BLOCK = 64
#: the base formats a plan may price: "compute" (the compute dtype, as without a base format) and "nf4"
BASE_FORMATS = ("compute", "nf4")


def nf4_bytes(numel: int) -> int:
    """Bytes of ``numel`` values in NF4: half a byte each and an fp32 absmax per :data:`NF4_BLOCK` values."""
    return -(-numel // 2) + 4 * -(-numel // NF4_BLOCK)


def priced_base(profile: ModelProfile, base_format: str) -> ModelProfile:
    """``profile`` with its frozen decoder-layer matrices priced in ``base_format`` (see [Note: pricing an NF4
    base]); "compute" returns it unchanged. ValueError naming ``base_format`` for another name."""
    if base_format not in BASE_FORMATS:
        raise ValueError(f"base_format: must be one of {', '.join(BASE_FORMATS)}; got {base_format!r}")
    if base_format == "compute":
        return profile
    in_layers = {t for u in profile.units if u.kind == "layer" for t in u.tensors}
    sized = dict(profile.tensor_bytes)
    for name in in_layers:
        if not profile.tensor_trainable[name] and len(profile.shape(name)) == 2:
            sized[name] = nf4_bytes(profile.tensor_numel[name])
    units = []
    for u in profile.units:
        saved = sum(profile.tensor_numel[t] * profile.compute_bytes - sized[t]
                    for t in dict.fromkeys(u.tensors) if t in sized and t not in profile.tensor_bytes)
        units.append(dataclasses.replace(u, weight_bytes=u.weight_bytes - saved))
    return dataclasses.replace(profile, units=units, tensor_bytes=sized)
