"""The device/host split of one memory budget: the fastest predicted step wins, a refusal names the budget."""
from types import SimpleNamespace

import pytest

from terastack.plan.budget_search import SHARES, search_budget_split, tier_memory
from terastack.plan.llm_planner import PlanError

GiB = 1 << 30


def _plan(step_s):
    return SimpleNamespace(prediction=SimpleNamespace(step_s=step_s))


def test_fastest_split_wins_and_ties_keep_the_first():
    tried = []

    def plan_for(device, host):
        tried.append((device, host))
        # fastest with 40% to the device tier; 60% predicts the same time
        share = round(100 * device / (device + host))
        return f"planner {share}", _plan(1.0 if share in (40, 60) else 2.0)

    planner, plan = search_budget_split(10 * GiB, plan_for, what="model")
    assert planner == "planner 40" and plan.prediction.step_s == 1.0
    total = tier_memory(10 * GiB)
    assert len(tried) == len(SHARES) and all(d + h == total for d, h in tried)


def test_splits_that_do_not_fit_are_skipped():
    planned, refused = [], []

    def plan_for(device, host):
        if device < 3 * GiB:
            refused.append(device)
            raise PlanError("device", needed=3 * GiB, available=device, limit=device, what="x")
        planned.append(device)
        return device, _plan(device / GiB)

    device, _ = search_budget_split(10 * GiB, plan_for, what="model")
    total = tier_memory(10 * GiB)
    # both sides ran: the splits below 3 GiB were refused, every other split was planned
    assert refused == [total * s // 100 for s in SHARES if total * s // 100 < 3 * GiB] != []
    assert planned == [total * s // 100 for s in SHARES if total * s // 100 >= 3 * GiB]
    assert len(planned) > 1
    # the fastest of the planned (here: the smallest device share that fits) wins
    assert device == min(planned) and device - total * 5 // 100 < 3 * GiB


def test_nothing_fits_names_the_memory_budget_and_the_smallest_shortfall():
    def plan_for(device, host):
        raise PlanError("host", needed=host + GiB + device // 100, available=host, limit=host, what="state")

    with pytest.raises(PlanError, match="memory budget exceeded for model with the best split") as info:
        search_budget_split(10 * GiB, plan_for, what="model")
    total = tier_memory(10 * GiB)
    assert info.value.budget == "memory" and info.value.available == total
    assert info.value.shortfall == GiB + (total * SHARES[0] // 100) // 100
