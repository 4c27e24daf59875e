"""One memory budget split between the device and host tiers where the plan predicts the fastest step (of steps
predicted near it: the fewest bytes moved).

Without an accelerator both tiers are host memory; ``TrainerConfig.memory_budget``
gives one number and this search decides how much of it the "device" tier (working
copies, kept activations) gets and how much the host tier (resting state, swapped
activations). It needs only a way to plan for a pair of budgets, so any planner whose
plans carry ``prediction.step_s`` and whose refusals are :class:`PlanError` can use it.

Every split is a whole plan (thousands of activation-policy candidates each); what makes that quick is the
planner's memory of what no candidate changes (per-unit activation bytes and times, the optimizer's sizes,
state homes per host room, each unit's weight bytes): at the 26-layer 3.4B shape the 17 splits, each planned
for the fastest step and again for the fewest bytes near it, took 3.6 s (one micro-batch) and 5.5 s (eight:
the vertical order refused at every split, then groups of 4) on the 2-core development machine (2026-12-02,
beside a test run).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, TypeVar

from terastack.plan.hardware import Hardware
from terastack.plan.llm_plan import LLMPlan, PlanError, candidate_rank
from terastack.plan.llm_planner import LLMPlanner
from terastack.plan.llm_profile import ModelProfile

P = TypeVar("P")

#: device shares tried, in percent of what the tiers get
SHARES = range(10, 95, 5)


def tier_memory(memory_budget: int) -> int:
    """What the two tiers share of ``memory_budget``. [Note: a memory budget bounds resident memory]
    (terastack.memory): the interpreter's own allocations (Python objects, thread stacks, allocator slack) get a
    tenth; the tiers split the rest."""
    return memory_budget - memory_budget // 10


def search_budget_split(memory_budget: int, plan_for: Callable[..., tuple[object, P]], *, what: str,
                        ties: float = 0.0) -> tuple[object, P]:
    """``plan_for(device_budget, host_budget) -> (planner, plan)`` over every share in :data:`SHARES` of
    :func:`tier_memory`; the pair whose plan predicts the shortest step (the first of equals) among the plans of
    the most preferred kind (a plan's ``search_rank``, lower first, 0 when it has none: e.g. the vertical order of
    micro-batches wherever some split fits it, as the planner's own choice for one split prefers it). When no
    split fits, the :class:`PlanError` names the whole budget and the smallest shortfall any split had.

    With ``ties`` > 0 ([Note: ties go to the fewest bytes] in terastack.plan.llm_plan) a second pass asks
    ``plan_for(device_budget, host_budget, step_ceiling)`` for each split's plan that moves the fewest bytes of
    those predicted within ``ties`` of the fastest step found, and the split whose plan moves the fewest wins."""
    total = tier_memory(memory_budget)
    splits = [(total * share // 100, total - total * share // 100) for share in SHARES]
    best, error = None, None
    fastest = {}  # split -> its fastest plan's step
    for device, host in splits:
        try:
            planner, plan = plan_for(device, host)
        except PlanError as exc:
            if error is None or exc.shortfall < error.shortfall:
                error = exc
            continue
        fastest[device, host] = plan.prediction.step_s
        if best is None or _key(plan) < _key(best[1]):
            best = (planner, plan)
    if best is None:
        raise PlanError("memory", needed=total + error.shortfall, available=total, limit=total,
                        what=f"{what} with the best split between device and host tiers ({error})")
    if ties <= 0:
        return best
    ceiling = best[1].prediction.step_s * (1 + ties)
    rank = getattr(best[1], "search_rank", 0)
    for (device, host), step_s in fastest.items():
        if step_s > ceiling:
            continue  # none of this split's plans is within the ties
        planner, plan = plan_for(device, host, ceiling)
        key = (getattr(plan, "search_rank", 0), candidate_rank(plan.prediction, ceiling))
        if key[0] == rank and key < (rank, candidate_rank(best[1].prediction, ceiling)):
            best = (planner, plan)
    return best


def _key(plan) -> tuple[int, float]:
    return getattr(plan, "search_rank", 0), plan.prediction.step_s


def plan_memory_budget(config: LLMPlanner.Config, memory_budget: int, profile: ModelProfile, hw: Hardware, *,
                       what: str, share: bool = True) -> tuple[LLMPlanner, LLMPlan]:
    """Planners of ``config`` over the splits of one memory budget between the tiers
    (:func:`search_budget_split`): the split and plan predicted fastest -- of those within ``config.step_ties``
    of it, the one that moves the fewest bytes ([Note: ties go to the fewest bytes] in terastack.plan.llm_plan).
    Each split's planner is made from the last and shares what it remembers of the profile
    (:meth:`LLMPlanner.for_config`); ``share=False`` makes each afresh (the same plans, more work)."""
    made: list[LLMPlanner] = []

    def plan_for(device_budget: int, host_budget: int, step_ceiling: float | None = None):
        # the search finds the fastest step and then the fewest bytes near it: each planner does one of the two
        changes = dict(device_budget=device_budget, host_budget=host_budget, step_ties=0.0,
                       step_ceiling=step_ceiling)
        planner = made[0].for_config(**changes) if made and share else LLMPlanner(
            dataclasses.replace(config, **changes))
        made[:] = [planner]
        return planner, planner.plan(profile, hw)

    return search_budget_split(memory_budget, plan_for, what=what, ties=config.step_ties)
