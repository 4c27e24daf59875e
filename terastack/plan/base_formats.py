"""The bytes of a frozen LoRA base in a base format, shared by the engine's store layout and the planner.

[Note: pricing an NF4 base]
With ``lora.base_format: nf4`` the frozen base rests on the store and streams in bitsandbytes' NF4 (the QLoRA
format): two 4-bit codes a byte and one fp32 absmax per block of 64 values (``quantize_4bit``'s default block,
without nested quantization of the absmax), dequantized per unit where the unit computes. As in QLoRA, the
frozen linear weights are quantized; embeddings, norms and the output head stay in the compute dtype. The
engine's profile records each quantized weight's bytes (``ModelProfile.frozen_rest``, from :func:`nf4_bytes`),
so the planner's store size, SSD traffic and device-link bytes count the base as it rests. The dequantization is
priced in the units' calibrated times: each timed forward and backward dequantizes the unit's NF4 weights as the
step does on every acquire (at 64 tokens a step on the CPU it is about half a layer's time: leaving it out
predicted a 70B LoRA step at -48%).
"""
from __future__ import annotations

#: values per fp32 absmax of bitsandbytes' 4-bit quantization (its ``blocksize`` default)
NF4_BLOCK = 64
#: ``lora.base_format`` values a plan prices: the compute dtype, or NF4
PLANNED_BASE_FORMATS = ("native", "nf4")


def nf4_bytes(numel: int) -> int:
    """Bytes of ``numel`` values in NF4: half a byte each and an fp32 absmax per :data:`NF4_BLOCK` values."""
    return -(-numel // 2) + 4 * -(-numel // NF4_BLOCK)
