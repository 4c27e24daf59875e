"""Schedule and activation specs: one registry each, read by the planner (the engine's side is
tests/llm/test_engine_specs.py)."""
import ast
from pathlib import Path

import pytest

from terastack.plan.activation_specs import ACTIVATIONS, HOST, KEEP, RECOMPUTE, SSD, activation_spec
from terastack.plan.llm_planner import LLMPlanner
from terastack.plan.schedule_specs import (AFTER_BACKWARD, DEFERRED, EAGER, SCHEDULES, DeferredSpec, ExecutorKind,
                                           Exposure, register_schedule, schedule_spec)
from terastack.tier import Tier
from terastack.tiers import Tier as StoreTier

from .test_llm_planner import CPU, profile

MiB = 1 << 20


def test_one_registry_each_and_unknown_names_name_the_field():
    assert list(SCHEDULES) == ["eager", "deferred", "after_backward"]
    assert list(ACTIVATIONS) == ["keep", "host", "ssd", "recompute"]
    assert schedule_spec("deferred") is DEFERRED and activation_spec("ssd") is SSD
    with pytest.raises(ValueError, match="^optimizer_schedule: must be one of eager, deferred, after_backward; got 'lazy'"):
        schedule_spec("lazy")
    with pytest.raises(ValueError, match="^optimizer_schedule:"):
        LLMPlanner.Config(device_budget=1 << 30, host_budget=1 << 30, optimizer_schedule="lazy")
    with pytest.raises(ValueError, match="^policy:"):
        LLMPlanner.Config(device_budget=1 << 30, host_budget=1 << 30, policy="keep,swap")
    with pytest.raises(ValueError, match="already|new"):
        register_schedule(DeferredSpec())


def test_schedule_specs_say_what_the_planner_used_to_derive_from_the_name():
    # back-pressure: eager waits for room; the others spill what the pool (two units' gradients) cannot hold
    assert EAGER.spill_traffic(100, 10) == 0 and EAGER.spill_room(100) == 0
    assert DEFERRED.spill_traffic(100, 10) == 80 and AFTER_BACKWARD.spill_room(100) == 100
    # memory: moments (+ master chunk in mixed precision) (+ a spilled gradient chunk without back-pressure)
    assert [s.records_per_chunk(m) for s in (EAGER, DEFERRED) for m in (False, True)] == [2, 3, 3, 4]
    assert EAGER.masters_held(8, [5, 1, 7]) == 8 + 7 + 5 and DEFERRED.masters_held(8, [5, 1, 7]) == 16
    # executor: only eager runs inline, and only when asked
    assert EAGER.executor(True) is ExecutorKind.INLINE and EAGER.executor(False) is ExecutorKind.THREAD
    assert DEFERRED.executor(True) is ExecutorKind.THREAD
    assert [s.retains_masters for s in (EAGER, DEFERRED, AFTER_BACKWARD)] == [True, True, False]
    e = Exposure(optimizer_apart_s=3.0, first_update_apart_s=0.5, first_state_io_s=0.25, forward_s=1.0,
                 state_io_s=4.0)
    assert (EAGER.exposed_s(e), DEFERRED.exposed_s(e), AFTER_BACKWARD.exposed_s(e)) == (0.75, 2.25, 4.0)
    EAGER.check_clipping(None)
    with pytest.raises(ValueError, match="^optimizer_schedule: eager updates cannot apply a global-norm clip exactly; use deferred"):
        EAGER.check_clipping(1.0)


def test_activation_specs_give_each_place_its_bytes():
    u = profile().units[1]
    assert [(s.device_bytes(u), s.host_bytes(u), s.ssd_bytes(u)) for s in (KEEP, HOST, SSD, RECOMPUTE)] == [
        (u.act_bytes, 0, 0), (0, u.act_bytes + u.act_tensors * 4096, 0), (0, 0, u.act_bytes), (u.boundary_bytes, 0, 0)]
    # (a host copy is a buffer padded for direct I/O per saved storage, as the engine's SwapToHost holds it)
    assert SSD.in_flight_bytes(u) == u.act_bytes + u.act_tensors * 4096 and KEEP.in_flight_bytes(u) == 0
    assert RECOMPUTE.recompute_s(0.5) == 0.5 and HOST.recompute_s(0.5) == 0.0


def test_a_new_schedule_is_one_spec_class_and_a_registry_entry():
    """A schedule the planner never heard of by name: it plans from the spec alone."""

    class Patient(DeferredSpec):
        name = "patient"

        def exposed_s(self, e):
            return 7.0  # waits a fixed while for every update

    register_schedule(Patient())
    try:
        prof = profile()
        p = LLMPlanner(LLMPlanner.Config(device_budget=1 << 30, host_budget=1 << 30, optimizer_schedule="patient")).plan(prof, CPU)
        d = LLMPlanner(LLMPlanner.Config(device_budget=1 << 30, host_budget=1 << 30, optimizer_schedule="deferred")).plan(prof, CPU)
        assert p.optimizer_schedule == "patient" and isinstance(p.schedule, Patient)
        assert p.prediction.exposed_s == 7.0
        assert p.prediction.step_s == pytest.approx(d.prediction.step_s - d.prediction.exposed_s + 7.0)
    finally:
        SCHEDULES.pop("patient")


def test_homes_are_tiers():
    assert Tier is StoreTier  # one enum, below the store and the planner
    p = LLMPlanner(LLMPlanner.Config(device_budget=1 << 30, host_budget=40 * MiB, grad_accum=2)).plan(profile(), CPU)
    homes = [*p.state_home.values(), *p.compute_home.values(), *p.grad_home.values()]
    assert homes and all(isinstance(h, Tier) for h in homes)
    assert {Tier.HOST, Tier.SSD} <= set(p.state_home.values()) | set(p.grad_home.values())
    assert [s.name for s in p.activation_specs()] == list(p.policies)


def test_plan_imports_no_engine_and_not_the_store():
    """The cost models sit below every engine and beside the store: they take Tier from terastack.tier."""
    root = Path(__file__).resolve().parents[2] / "terastack" / "plan"
    taken = set()
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("terastack."):
                taken.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                taken |= {a.name.split(".")[1] for a in node.names if a.name.startswith("terastack.")}
    assert not taken & {"io", "tiers", "llm", "gnn", "disdp", "kernels", "training"}
