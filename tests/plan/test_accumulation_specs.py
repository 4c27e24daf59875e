"""The orders of a step's micro-batches as the planner prices them (terastack.plan.accumulation_specs)."""
import pytest
import torch

from terastack.plan.accumulation_specs import (ACCUMULATIONS, AUTO, HORIZONTAL, VERTICAL, accumulation_spec,
                                               candidates, preference)
from terastack.plan.hardware import Hardware
from terastack.plan.llm_planner import LLMPlanner, PlanError

GiB = 1 << 30
CPU = Hardware(name="cpu", measured=True, cores=2, host_memory_bytes=24 << 30, cpu_flops=5e10,
               memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=2e9, ssd_write_bytes_per_s=1e9,
               cpu_adam_params_per_s=3e8, cpu_io_slowdown_per_gbps=0.07)


def model_profile(batch: int, layers: int = 4):
    from terastack.llm.engine.profile import profile_config
    from terastack.training.model_registry import resolve_model

    hf_config, _ = resolve_model("openllama-3b")
    hf_config.num_hidden_layers = layers
    return profile_config(hf_config, batch=batch, seq_len=256, dtype=torch.float32, name="openllama-3b")


def test_registry_and_names():
    assert set(ACCUMULATIONS) == {"horizontal", "vertical"}
    names = lambda specs: [s.name for s in specs]  # noqa: E731
    assert names(candidates(AUTO, 8)) == ["vertical", "grouped-4", "grouped-2", "horizontal"]
    assert names(candidates(AUTO, 6)) == ["vertical", "grouped-3", "grouped-2", "horizontal"]
    assert names(candidates(AUTO, 1)) == names(candidates(AUTO, 2)) == names(candidates(AUTO, 3)) == \
        ["vertical", "horizontal"]
    assert candidates("horizontal", 8) == (HORIZONTAL,) and names(candidates("grouped-3", 8)) == ["grouped-3"]
    for bad in ("diagonal", "grouped-", "grouped-x", "grouped--2"):
        with pytest.raises(ValueError, match="^accumulation: must be auto, one of horizontal, vertical or grouped-G"):
            accumulation_spec(bad)
    for small in ("grouped-0", "grouped-1"):
        with pytest.raises(ValueError, match="^accumulation: a group stacks at least 2 micro-batches"):
            accumulation_spec(small)
    with pytest.raises(ValueError, match="^accumulation:"):
        LLMPlanner.Config(device_budget=GiB, host_budget=GiB, accumulation="diagonal")
    assert VERTICAL.passes(8) == 1 and HORIZONTAL.passes(8) == 8
    assert not VERTICAL.sums_gradients(8) and HORIZONTAL.sums_gradients(8) and not HORIZONTAL.sums_gradients(1)
    # groups: ceil(N / G) passes, the last one taking what is left; sums only when there is more than one pass
    three = accumulation_spec("grouped-3")
    assert [(three.group(n), three.passes(n)) for n in (1, 2, 3, 4, 8)] == [(1, 1), (2, 1), (3, 1), (3, 2), (3, 3)]
    assert three.sums_gradients(4) and not three.sums_gradients(3)
    # AUTO ranks the orders by passes: each pass reads every weight twice
    assert [preference(s, 8) for s in candidates(AUTO, 8)] == [0, 1, 3, 7]
    assert {preference(s, 1) for s in candidates(AUTO, 1)} == {0}


def test_the_vertical_profile_is_the_profile_of_all_rows_at_once():
    """Scaling a micro-batch's profile by N gives what profiling N micro-batches' rows gives: exactly, but for
    the few saved bytes that do not grow with the rows (the rotary tables), which it counts N times (0.2% more
    here: the plan errs on the side of memory)."""
    import dataclasses

    one, four = model_profile(1), model_profile(4)
    scaled = VERTICAL.step_profile(one, 4)
    assert HORIZONTAL.step_profile(one, 4) is one
    assert dataclasses.replace(scaled, units=four.units) == four
    for mine, real in zip(scaled.units, four.units):
        assert real.act_bytes <= mine.act_bytes <= 1.01 * real.act_bytes
        assert dataclasses.replace(mine, act_bytes=real.act_bytes) == real


def _same_step_but_the_stacked_copy(stacked, reference, micro_batches: int) -> None:
    """The same prediction, but for the stacked copy of the step's data that stacking passes hold beside the
    micro-batches ([Note: the batch is priced] in terastack.plan.llm_profile)."""
    import dataclasses

    from terastack.plan.llm_profile import data_bytes

    copy = data_bytes(model_profile(1).tokens, micro_batches, stacked=False)
    assert stacked.prediction.transient_bytes == reference.prediction.transient_bytes + copy
    assert dataclasses.replace(stacked.prediction, transient_bytes=0) == \
        dataclasses.replace(reference.prediction, transient_bytes=0)


@pytest.mark.parametrize("mode", ["eager", "deferred"])
def test_a_vertical_step_is_planned_as_one_step_of_all_the_rows(mode):
    """The vertical plan of N micro-batches of B rows is the one-batch plan of N x B rows (weights read once per
    step, no gradient sums); the horizontal plan reads weights and computes N times and holds the sums."""
    n = 4
    budgets = dict(device_budget=2 * GiB, host_budget=3 * GiB, optimizer_schedule=mode)
    keep = dict(budgets, device_budget=6 * GiB, policy="keep")  # the same compute: nothing recomputed
    vertical = LLMPlanner(LLMPlanner.Config(grad_accum=n, accumulation="vertical", **budgets)).plan(
        model_profile(1), CPU)
    reference = LLMPlanner(LLMPlanner.Config(**budgets)).plan(VERTICAL.step_profile(model_profile(1), n), CPU)
    assert vertical.accumulation == "vertical" and vertical.grad_accum == n and vertical.grad_home == {}
    _same_step_but_the_stacked_copy(vertical, reference, n)
    assert (vertical.policies, vertical.state_home) == (reference.policies, reference.state_home)
    horizontal, vertical_kept = (LLMPlanner(LLMPlanner.Config(grad_accum=n, accumulation=order, **keep)).plan(
        model_profile(1), CPU) for order in ("horizontal", "vertical"))
    assert horizontal.accumulation == "horizontal" and horizontal.grad_home
    assert horizontal.prediction.compute_s == pytest.approx(vertical_kept.prediction.compute_s)
    assert horizontal.prediction.ssd_read_bytes > vertical_kept.prediction.ssd_read_bytes
    assert "vertical" in vertical.describe(model_profile(1)) and vertical.summary()["accumulation"] == "vertical"


@pytest.mark.parametrize("mode", ["eager", "deferred"])
def test_a_grouped_step_is_planned_as_horizontal_passes_of_stacked_rows(mode):
    """``grouped-G`` with N micro-batches of B rows is planned as the horizontal plan of N / G micro-batches of
    G x B rows: the same prediction, placement and sums."""
    n, g = 8, 4
    budgets = dict(device_budget=2 * GiB, host_budget=3 * GiB, optimizer_schedule=mode)
    grouped = LLMPlanner(LLMPlanner.Config(grad_accum=n, accumulation=f"grouped-{g}", **budgets)).plan(
        model_profile(1), CPU)
    reference = LLMPlanner(LLMPlanner.Config(grad_accum=n // g, accumulation="horizontal", **budgets)).plan(
        VERTICAL.step_profile(model_profile(1), g), CPU)
    assert grouped.accumulation == "grouped-4" and grouped.grad_accum == n and grouped.sums_gradients
    _same_step_but_the_stacked_copy(grouped, reference, n)
    assert (grouped.policies, grouped.state_home, grouped.grad_home) == \
        (reference.policies, reference.state_home, reference.grad_home)
    assert "grouped-4: 2 passes of 4 stacked" in grouped.describe(model_profile(1))


def test_auto_takes_the_fewest_passes_that_fit():
    profile = model_profile(1)
    config = dict(grad_accum=16, host_budget=4 * GiB)
    orders = [spec.name for spec in candidates(AUTO, 16)]
    assert orders == ["vertical", "grouped-8", "grouped-4", "grouped-2", "horizontal"]
    needed = {}
    for order in orders:  # the device budget each order needs, from its refusal of 64 MiB
        with pytest.raises(PlanError) as info:
            LLMPlanner(LLMPlanner.Config(device_budget=64 << 20, accumulation=order, **config)).plan(profile, CPU)
        needed[order] = info.value.needed
    assert [needed[o] for o in orders] == sorted(needed.values(), reverse=True) and len(set(needed.values())) == 5
    for wider, order in zip(orders, orders[1:]):
        between = (needed[wider] + needed[order]) // 2
        with pytest.raises(PlanError):
            LLMPlanner(LLMPlanner.Config(device_budget=between, accumulation=wider, **config)).plan(profile, CPU)
        fallback = LLMPlanner(LLMPlanner.Config(device_budget=between, **config)).plan(profile, CPU)
        assert fallback.accumulation == order and fallback.sums_gradients
    roomy = LLMPlanner(LLMPlanner.Config(device_budget=needed["vertical"], **config)).plan(profile, CPU)
    assert roomy.accumulation == "vertical" and not roomy.sums_gradients
    with pytest.raises(PlanError) as info:  # none fits: the horizontal order's refusal
        LLMPlanner(LLMPlanner.Config(device_budget=64 << 20, **config)).plan(profile, CPU)
    assert info.value.needed == needed["horizontal"]


def test_a_vertical_step_is_priced_at_the_times_measured_at_its_width():
    """Times measured with the micro-batches stacked replace N times a micro-batch's; without them the profile
    scales; they survive the profile's JSON form."""
    import dataclasses
    import json

    from terastack.plan.llm_profile import ModelProfile

    one = model_profile(batch=1, layers=2)
    timed = dataclasses.replace(one, units=[dataclasses.replace(u, fwd_s=0.01 * (i + 1), bwd_s=0.02 * (i + 1))
                                            for i, u in enumerate(one.units)])
    scaled = VERTICAL.step_profile(timed, 4)
    assert [t for u in scaled.units for t in (u.fwd_s, u.bwd_s)] == pytest.approx(
        [t for i in range(len(one.units)) for t in (0.04 * (i + 1), 0.08 * (i + 1))])
    wide = [(0.03 * (i + 1), 0.05 * (i + 1)) for i in range(len(one.units))]
    stacked = dataclasses.replace(timed, stacked_times={4: wide})
    assert [(u.fwd_s, u.bwd_s) for u in VERTICAL.step_profile(stacked, 4).units] == wide
    assert VERTICAL.step_profile(stacked, 2).units[0].fwd_s == pytest.approx(0.02)   # another width: scaled
    assert HORIZONTAL.step_profile(stacked, 4) is stacked
    assert LLMPlanner(LLMPlanner.Config(device_budget=8 * GiB, host_budget=8 * GiB, grad_accum=4,
                                        accumulation="vertical")).plan(stacked, CPU).prediction.compute_s \
        == pytest.approx(sum(f + b for f, b in wide))
    back = ModelProfile.from_dict(json.loads(json.dumps(stacked.to_dict())))
    assert back.stacked_times == {4: [tuple(t) for t in wide]}
    with pytest.raises(ValueError, match=r"^stacked_times\[4\]: 1 units timed"):
        VERTICAL.step_profile(dataclasses.replace(timed, stacked_times={4: wide[:1]}), 4)
