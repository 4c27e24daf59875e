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

Between the two, ``grouped-G`` runs the micro-batches in passes of G stacked
together (the vertical order's single pass, made of G of them): weights are
read twice per pass, ceil(N / G) passes a step, and the gradients of the passes
add up in sums as the horizontal order's micro-batches do. It is the order for a
model whose vertical pass does not fit: at 3.4B with 8 micro-batches of
256 tokens the stacked working memory was 57 MiB over a 4 GiB budget, and the
horizontal order read the weights 8 times (219 GB a step, 738 s); groups of 4
read them twice.

:data:`AUTO` is not an order the engine runs: the planner takes the order with
the fewest passes whose plan fits the budgets (:func:`candidates`: vertical,
then groups of the divisors of N from the largest, then horizontal). A new
order is a subclass here registered with :func:`register_accumulation`.

[Note: calibrating the stacked width]
Whether an order fits is a question of memory alone; its times only rank the
splits of a budget among the plans of the order that fits with the fewest
passes. So a calibrated trainer plans once with the stacked widths estimated
from one micro-batch's times, times the units at the one width that plan
chose (none for the horizontal order), and plans again, that order only, with
those times. Timing every width ``auto`` might choose (8, 4 and 2 stacked for 8
micro-batches) cost minutes at 3.4B for widths that could not fit.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

#: the planner chooses: vertical when it fits the budgets, else horizontal
AUTO = "auto"


class AccumulationSpec:
    """One order of the micro-batches of a step: see [Note: vertical and horizontal accumulation]."""

    name: ClassVar[str] = ""

    def __repr__(self) -> str:
        return f"<accumulation {self.name}>"

    def group(self, micro: int) -> int:
        """Micro-batches stacked into one pass (one forward and one backward over the units)."""
        return 1

    def passes(self, micro: int) -> int:
        """Forwards and backwards per step (each reads every unit's weights once forward and once backward)."""
        return -(-micro // self.group(micro))

    def sums_gradients(self, micro: int) -> bool:
        """Gradients are summed across passes in sums kept between them (planned as state)."""
        return self.passes(micro) > 1

    def step_profile(self, profile, micro: int):
        """The profile of one pass: a micro-batch's (horizontal), or ``group(micro)`` micro-batches' at once
        (vertical, grouped: activations, working memory, logits, FLOPs and measured times scale with the rows)."""
        width = self.group(micro)
        if width == 1:
            return profile
        measured = profile.stacked_times.get(width)
        if measured is not None and len(measured) != len(profile.units):
            raise ValueError(f"stacked_times[{width}]: {len(measured)} units timed, the profile has "
                             f"{len(profile.units)}")
        times = measured or [(None if u.fwd_s is None else u.fwd_s * width,
                              None if u.bwd_s is None else u.bwd_s * width) for u in profile.units]
        units = [dataclasses.replace(
            u, fwd_flops=u.fwd_flops * width, bwd_flops=u.bwd_flops * width, act_bytes=u.act_bytes * width,
            boundary_bytes=u.boundary_bytes * width, out_bytes=u.out_bytes * width, fwd_s=fwd_s, bwd_s=bwd_s)
            for u, (fwd_s, bwd_s) in zip(profile.units, times)]
        return dataclasses.replace(profile, batch=profile.batch * width, units=units,
                                   logits_bytes=profile.logits_bytes * width, stacked_times={})


class HorizontalSpec(AccumulationSpec):
    name = "horizontal"


class VerticalSpec(AccumulationSpec):
    name = "vertical"

    def group(self, micro: int) -> int:
        return micro


class GroupedSpec(AccumulationSpec):
    """Passes of ``size`` micro-batches stacked (the last pass takes what is left)."""

    #: the prefix of a grouped order's name: ``grouped-4`` stacks 4 micro-batches a pass
    PREFIX: ClassVar[str] = "grouped-"

    def __init__(self, size: int):
        if size < 2:
            raise ValueError(f"accumulation: a group stacks at least 2 micro-batches, got {size}")
        self.size = size
        self.name = f"{self.PREFIX}{size}"

    def group(self, micro: int) -> int:
        return min(self.size, micro)


ACCUMULATIONS: dict[str, AccumulationSpec] = {}


def register_accumulation(spec: AccumulationSpec) -> AccumulationSpec:
    if not spec.name or spec.name == AUTO or spec.name in ACCUMULATIONS:
        raise ValueError(f"accumulation: {spec.name!r} is empty, reserved or already registered")
    ACCUMULATIONS[spec.name] = spec
    return spec


HORIZONTAL = register_accumulation(HorizontalSpec())
VERTICAL = register_accumulation(VerticalSpec())

def accumulation_spec(name: str) -> AccumulationSpec:
    spec = ACCUMULATIONS.get(name)
    if spec is None and name.startswith(GroupedSpec.PREFIX) and name[len(GroupedSpec.PREFIX):].isdigit():
        return GroupedSpec(int(name[len(GroupedSpec.PREFIX):]))
    if spec is None:
        raise ValueError(f"accumulation: must be {AUTO}, one of {', '.join(ACCUMULATIONS)} or "
                         f"{GroupedSpec.PREFIX}G (G >= 2 micro-batches a pass), got {name!r}")
    return spec


def preference(spec: AccumulationSpec, grad_accum: int) -> int:
    """How :data:`AUTO` ranks the order ``spec`` for ``grad_accum`` micro-batches, lower first: its passes a step
    less one (0 for a step run in one pass, whatever its order): each pass reads every weight twice."""
    return spec.passes(grad_accum) - 1


def candidates(name: str, micro: int = 1) -> tuple[AccumulationSpec, ...]:
    """The orders to plan for ``micro`` micro-batches a step, first choice first: ``name``'s spec, or for
    :data:`AUTO` vertical, groups of each divisor of ``micro`` between, largest first, then horizontal."""
    if name != AUTO:
        return (accumulation_spec(name),)
    groups = tuple(GroupedSpec(g) for g in range(micro - 1, 1, -1) if micro % g == 0)
    return (VERTICAL, *groups, HORIZONTAL)
