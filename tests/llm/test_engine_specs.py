"""The engine's side of the schedule and activation specs: every registered spec runs, found by the spec."""
import pytest

from terastack.llm.engine.schedules import AfterBackward, Deferred, Eager, EagerInline, Schedule, schedule_class
from terastack.llm.engine.unit_policies import Keep, Recompute, SwapHost, SwapSsd, unit_policy
from terastack.plan.activation_specs import ACTIVATIONS, ActivationSpec
from terastack.plan.schedule_specs import SCHEDULES, ExecutorKind


def test_every_schedule_spec_has_its_runtime_schedules():
    found = {(name, kind): schedule_class(spec, spec.executor(kind is ExecutorKind.INLINE))
             for name, spec in SCHEDULES.items() for kind in ExecutorKind}
    assert found == {("eager", ExecutorKind.INLINE): EagerInline, ("eager", ExecutorKind.THREAD): Eager,
                     ("deferred", ExecutorKind.INLINE): Deferred, ("deferred", ExecutorKind.THREAD): Deferred,
                     ("after_backward", ExecutorKind.INLINE): AfterBackward,
                     ("after_backward", ExecutorKind.THREAD): AfterBackward}
    for cls in set(found.values()):
        assert issubclass(cls, Schedule) and SCHEDULES[cls.spec.name] is cls.spec


def test_every_activation_spec_has_its_unit_policy():
    found = {name: type(unit_policy(name)) for name in ACTIVATIONS}
    assert found == {"keep": Keep, "host": SwapHost, "ssd": SwapSsd, "recompute": Recompute}
    assert all(unit_policy(name).spec is ACTIVATIONS[name] for name in ACTIVATIONS)


def test_a_spec_without_a_runtime_is_refused_by_name():
    class Nowhere(ActivationSpec):
        name = "nowhere"

    ACTIVATIONS["nowhere"] = Nowhere()
    try:
        with pytest.raises(ValueError, match="^policy: the engine has no runtime for the activation policy 'nowhere'"):
            unit_policy("nowhere")
    finally:
        ACTIVATIONS.pop("nowhere")
