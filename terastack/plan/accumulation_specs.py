"""How the micro-batches of an accumulated step move through the units, as the planner and the engine both read it.

[Note: vertical and horizontal accumulation]
With ``grad_accum`` N a step is N micro-batches and one AdamW update. Two
orders run them:

* horizontal: each micro-batch is a whole forward and backward of its own; a
  unit's weights are read 2N times per step, and every trainable tensor's
  gradient is added to a sum kept between the micro-batches (host or SSD, as
  planned; [Note: gradient accumulation] in terastack.llm.engine.accumulate);
* vertical: the forward of a unit runs for all N micro-batches before the next
  unit starts, and its backward for all N before the previous unit's: weights
  are read twice per step whatever N, the gradients of the N micro-batches add
  up inside the unit's backward (no sum is kept or spilled), and the update of a
  unit runs as the schedule says, as in a one-batch step. The price: what a unit
  saves for backward, its working memory and the logits are N times those of a
  micro-batch, so the activation policy is chosen for N micro-batches at once.

The engine runs the vertical order as ONE forward and backward of the N
micro-batches stacked into N x B rows (shorter ones padded on the right with
positions outside the loss, which causal attention keeps from the real
tokens). With the loss normalised by the step's total of target tokens
(``num_items_in_batch``) that is the plain step on the concatenated batch
itself, so it is exact by construction. The planner prices it as a one-pass
step of a profile N times as wide (:meth:`AccumulationSpec.step_profile`):
bytes and FLOPs scale with the rows; times are those measured at that width
when the profile has them (``ModelProfile.stacked_times``: a matmul over N
times the rows need not take N times as long), else N times a micro-batch's.

:data:`AUTO` is not an order the engine runs: the planner takes the vertical
order when a plan for it fits the budgets, else the horizontal one. A new
order is a subclass here registered with :func:`register_accumulation`.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

#: the planner chooses: vertical when it fits the budgets, else horizontal
AUTO = "auto"


class AccumulationSpec:
    """One order of the micro-batches of a step: see [Note: vertical and horizontal accumulation]."""

    name: ClassVar[str] = ""
    #: the engine runs the step's micro-batches as one batch (one forward and one backward per step)
    one_pass: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<accumulation {self.name}>"

    def passes(self, micro: int) -> int:
        """Forwards and backwards per step (each reads every unit's weights once forward and once backward)."""
        return 1 if self.one_pass else micro

    def sums_gradients(self, micro: int) -> bool:
        """Gradients are summed across passes in sums kept between them (planned as state)."""
        return self.passes(micro) > 1

    def step_profile(self, profile, micro: int):
        """The profile of one pass: a micro-batch's (horizontal), or ``micro`` micro-batches' at once (vertical:
        activations, working memory, logits, FLOPs and measured times scale with the rows)."""
        if not self.one_pass or micro == 1:
            return profile
        measured = profile.stacked_times.get(micro)
        if measured is not None and len(measured) != len(profile.units):
            raise ValueError(f"stacked_times[{micro}]: {len(measured)} units timed, the profile has "
                             f"{len(profile.units)}")
        times = measured or [(None if u.fwd_s is None else u.fwd_s * micro,
                              None if u.bwd_s is None else u.bwd_s * micro) for u in profile.units]
        units = [dataclasses.replace(
            u, fwd_flops=u.fwd_flops * micro, bwd_flops=u.bwd_flops * micro, act_bytes=u.act_bytes * micro,
            boundary_bytes=u.boundary_bytes * micro, out_bytes=u.out_bytes * micro, fwd_s=fwd_s, bwd_s=bwd_s)
            for u, (fwd_s, bwd_s) in zip(profile.units, times)]
        return dataclasses.replace(profile, batch=profile.batch * micro, units=units,
                                   logits_bytes=profile.logits_bytes * micro, stacked_times={})


class HorizontalSpec(AccumulationSpec):
    name = "horizontal"


class VerticalSpec(AccumulationSpec):
    name = "vertical"
    one_pass = True


ACCUMULATIONS: dict[str, AccumulationSpec] = {}


def register_accumulation(spec: AccumulationSpec) -> AccumulationSpec:
    if not spec.name or spec.name == AUTO or spec.name in ACCUMULATIONS:
        raise ValueError(f"accumulation: {spec.name!r} is empty, reserved or already registered")
    ACCUMULATIONS[spec.name] = spec
    return spec


HORIZONTAL = register_accumulation(HorizontalSpec())
VERTICAL = register_accumulation(VerticalSpec())

#: the orders :data:`AUTO` tries, first choice first
AUTO_ORDER = (VERTICAL, HORIZONTAL)


def accumulation_spec(name: str) -> AccumulationSpec:
    spec = ACCUMULATIONS.get(name)
    if spec is None:
        raise ValueError(f"accumulation: must be {AUTO} or one of {', '.join(ACCUMULATIONS)}, got {name!r}")
    return spec


def preference(spec: AccumulationSpec, grad_accum: int) -> int:
    """How :data:`AUTO` ranks the order ``spec`` for ``grad_accum`` micro-batches, lower first: its place in
    :data:`AUTO_ORDER`, and 0 for a step run in one pass whatever its order (one micro-batch)."""
    return 0 if spec.passes(grad_accum) == 1 else AUTO_ORDER.index(spec)


def candidates(name: str) -> tuple[AccumulationSpec, ...]:
    """The orders to plan for, first choice first: ``name``'s spec, or :data:`AUTO_ORDER`."""
    return AUTO_ORDER if name == AUTO else (accumulation_spec(name),)
