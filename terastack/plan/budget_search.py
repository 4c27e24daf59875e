"""One memory budget split between the device and host tiers where the plan predicts the fastest step.

Without an accelerator both tiers are host memory; ``TrainerConfig.memory_budget``
gives one number and this search decides how much of it the "device" tier (working
copies, kept activations) gets and how much the host tier (resting state, swapped
activations). It needs only a way to plan for a pair of budgets, so any planner whose
plans carry ``prediction.step_s`` and whose refusals are :class:`PlanError` can use it.

Every split is a whole plan (thousands of activation-policy candidates each); what makes that quick is the
planner's memory of what no candidate changes (per-unit activation bytes and times, the optimizer's sizes,
state homes per host room): at the 26-layer 3.4B shape the 17 splits take about 1.5 s on a 2-core machine.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from terastack.plan.llm_plan import PlanError

P = TypeVar("P")

#: device shares tried, in percent of what the tiers get
SHARES = range(10, 95, 5)


def tier_memory(memory_budget: int) -> int:
    """What the two tiers share of ``memory_budget``. [Note: a memory budget bounds resident memory]
    (terastack.memory): the interpreter's own allocations (Python objects, thread stacks, allocator slack) get a
    tenth; the tiers split the rest."""
    return memory_budget - memory_budget // 10


def search_budget_split(memory_budget: int, plan_for: Callable[[int, int], tuple[object, P]], *,
                        what: str) -> tuple[object, P]:
    """``plan_for(device_budget, host_budget) -> (planner, plan)`` over every share in :data:`SHARES` of
    :func:`tier_memory`; the pair whose plan predicts the shortest step (the first of equals) among the plans of
    the most preferred kind (a plan's ``search_rank``, lower first, 0 when it has none: e.g. the vertical order of
    micro-batches wherever some split fits it, as the planner's own choice for one split prefers it). When no
    split fits, the :class:`PlanError` names the whole budget and the smallest shortfall any split had."""
    total = tier_memory(memory_budget)
    best, error = None, None
    for share in SHARES:
        try:
            planner, plan = plan_for(total * share // 100, total - total * share // 100)
        except PlanError as exc:
            if error is None or exc.shortfall < error.shortfall:
                error = exc
            continue
        if best is None or _key(plan) < _key(best[1]):
            best = (planner, plan)
    if best is None:
        raise PlanError("memory", needed=total + error.shortfall, available=total, limit=total,
                        what=f"{what} with the best split between device and host tiers ({error})")
    return best


def _key(plan) -> tuple[int, float]:
    return getattr(plan, "search_rank", 0), plan.prediction.step_s
