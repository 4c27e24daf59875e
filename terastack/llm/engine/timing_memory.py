"""What timing a unit on this machine holds (terastack.llm.engine.profile's calibration), held within the budget:
[Note: calibrating within the budget]."""
from __future__ import annotations

import torch

from terastack.plan.base_formats import nf4_bytes
from terastack.plan.llm_plan import PlanError
from terastack.plan.llm_profile import CalibrationBytes

#: a unit whose weights take this much is timed on one copy ([Note: calibrating with weights from memory])
CACHE_COLD_BYTES = 64 << 20


def weights_at_rest(unit, shapes, nf4_names: frozenset, *, device: torch.device, dtype: torch.dtype,
                     gen: torch.Generator) -> dict:
    """One copy of a unit's random weights as the step holds them at rest: in the compute dtype, or as NF4
    records for ``nf4_names``. Each is drawn in the compute dtype and scaled in place, and an NF4 weight's dense
    values are let go once encoded, so making them holds no more than one dense tensor beyond the copy."""
    from terastack.training.hf import nf4

    out = {}
    for n, shape in shapes:
        w = torch.randn(shape, generator=gen, dtype=dtype).mul_(0.02)
        out[n] = nf4.encode(w).to(device) if n in nf4_names else w.to(device).requires_grad_(unit.trainable[n])
        del w
    return out


def calibration_bytes(unit, record: dict, flat, floating_in, *, compute_bytes: int,
                      nf4_names: frozenset) -> CalibrationBytes:
    """What timing ``unit`` holds at once ([Note: calibrating within the budget]), from its shapes and the profile
    pass's ``record`` of it (activations saved, output bytes)."""
    at_rest = working = 0
    for n, p in unit.module.named_parameters(remove_duplicate=False):
        dense = p.numel() * compute_bytes
        at_rest += nf4_bytes(p.numel()) if n in nf4_names else dense
        # the dequantized copy it computes with; a trainable weight's gradient
        working += dense if n in nf4_names or unit.trainable[n] else 0
    inputs = sum(flat[j].numel() for j in floating_in) * compute_bytes
    # the random inputs and their gradients, the output and the gradient fed to it, the saved activations and
    # backward's gradients of them (each at most as large)
    working += 2 * (inputs + record["out_bytes"] + record["act_bytes"])
    return CalibrationBytes(at_rest=at_rest, working=working)


def timing_copies(unit, need: CalibrationBytes, *, device: torch.device, compute_bytes: int,
            budget: tuple[str, int] | None) -> int:
    """How many copies of ``unit``'s weights it is timed over: three on a CPU for a unit that fits a cache, fewer
    where they would not fit ``budget``; refused (a PlanError naming the budget) where one copy does not fit.

    [Note: calibrating with weights from memory]
    In a step every unit's weights come from memory, not from a cache the previous run of the same unit warmed; on
    a CPU the unit is timed over copies of its weights in turn (measured on llama-150m's layer: 70 ms on one copy,
    81 ms over six, the latter within 5% of the layer's time inside the step). Units too big for any cache need one.

    [Note: calibrating within the budget]
    Timing a unit is set-up's largest working set: at 70B a decoder layer is 0.86B parameters, and timing it on
    dense random weights (1.7 GB in bf16, drawn in fp32) beside their NF4 records and the copy dequantized from
    them held 4.8-6 GiB, which a 3.5 GiB budget's step never holds, and the 70B row's watchdog stopped it in
    set-up. So a unit is timed holding what the step holds for the unit computing: its weights as they rest (an
    NF4 base as its records only; the dense values each is drawn as are let go once encoded), the copy it
    computes with (dequantized for each forward and backward, as the step's acquire does), its inputs, output,
    activations and gradients (:func:`calibration_bytes`). Before anything is made for it, those bytes (times
    the copies above) are held against the budget the trainer's memory has before its store holds anything (the
    device budget, or with one memory budget what the tiers share of it): copies are dropped to fit, and a unit
    one copy of which does not fit is refused, as its step would be."""
    dense = sum(p.numel() for _, p in unit.module.named_parameters(remove_duplicate=False)) * compute_bytes
    copies = 3 if device.type == "cpu" and dense < CACHE_COLD_BYTES else 1
    if budget is None:
        return copies
    name, limit = budget
    while copies > 1 and need.held(copies) > limit:
        copies -= 1
    if need.held(copies) > limit:
        raise PlanError(name, needed=need.held(1), available=limit, limit=limit,
                        what=f"timing unit {unit.path} on this machine (its weights as they rest, the copy it "
                             "computes with, its inputs, activations and gradients)")
    return copies
