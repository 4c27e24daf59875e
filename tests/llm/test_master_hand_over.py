"""Backward hands a unit's fp32 working copies to its update; the planner counts the masters that are not handed
over as read again. Both follow one rule (``OptimizerState.hand_over``, ``optimizer_sizes.masters_reread``)."""
import dataclasses
import threading
from types import SimpleNamespace

import pytest

from terastack.llm.engine.optimizer_state import OptimizerState
from terastack.plan.llm_profile import held_bytes
from terastack.plan.optimizer_sizes import OptimizerSizes, masters_reread
from terastack.plan.schedule_specs import SCHEDULES
from terastack.tier import Tier
from tests.plan.test_llm_planner import profile

BLOCK = held_bytes(1)


def _state(numel: dict[str, int], masters_bytes: int, cv=None) -> OptimizerState:
    tensors = {n: SimpleNamespace(numel=k) for n, k in numel.items()}
    return OptimizerState(SimpleNamespace(store=None), tensors, cv=cv or threading.Condition(), failure=None,
                          masters_bytes=masters_bytes, writeback_bytes=0, read_ahead_bytes=0, timeout=60.0)


class _SeenWaiting(threading.Condition):
    """A condition that says (``waiting``) when a thread waits on it with its predicate still false."""

    def __init__(self):
        super().__init__()
        self.waiting = threading.Event()

    def wait_for(self, predicate, timeout=None):
        if not predicate():
            self.waiting.set()
        return super().wait_for(predicate, timeout)


def test_inline_a_unit_that_fits_the_whole_allowance_is_handed_over_without_the_reserve():
    # two masters of one block each, the largest master two blocks: the allowance holds two blocks
    state = _state({"a": BLOCK // 4, "b": BLOCK // 4, "big": BLOCK // 2}, masters_bytes=2 * BLOCK)
    # beside an update that may be running (the optimizer thread), room for the largest master stays free
    assert state.hand_over(["a", "b"]) == set()
    # inline, the unit's own update comes next and reads none of them
    assert state.hand_over(["a", "b"], alone=True) == {"a", "b"}


def test_inline_the_hand_over_waits_for_the_last_units_masters_on_their_way_home():
    cv = _SeenWaiting()
    state = _state({"old": BLOCK // 2, "a": BLOCK // 4, "b": BLOCK // 4}, masters_bytes=2 * BLOCK, cv=cv)
    state.admit_master("old")  # the previous unit's master, being written back
    handed = []
    backward = threading.Thread(target=lambda: handed.append(state.hand_over(["a", "b"], alone=True)))
    backward.start()
    # it waits for the write-back rather than leave them to be read
    assert cv.waiting.wait(60) and not handed
    state._master_gone("old")  # the write-back's completion callback, as OptimizerState.finish_master sets it
    backward.join(60)
    assert handed == [{"a", "b"}]


def test_a_unit_larger_than_the_allowance_keeps_the_reserve_inline_too():
    state = _state({"a": BLOCK // 4, "b": BLOCK // 4, "c": BLOCK // 4, "big": BLOCK // 4}, masters_bytes=2 * BLOCK)
    assert state.hand_over(["a", "b", "c"], alone=True) == {"a"}


def test_inline_a_larger_unit_hands_over_what_it_would_on_a_fast_disk():
    """[Note: the hand-over does not depend on the disk's pace]: the last unit's master still on its way home (a
    slow disk) is waited for, not counted against this unit's room: the same master is handed over as when it
    had landed, and the others are read again, as the planner counts."""
    cv = _SeenWaiting()
    state = _state({"old": BLOCK // 4, "a": BLOCK // 4, "b": BLOCK // 4, "c": BLOCK // 4}, masters_bytes=2 * BLOCK,
                   cv=cv)
    state.admit_master("old")  # the previous unit's master, being written back
    handed = []
    backward = threading.Thread(target=lambda: handed.append(state.hand_over(["a", "b", "c"], alone=True)))
    backward.start()
    assert cv.waiting.wait(60) and not handed
    state._master_gone("old")
    backward.join(60)
    assert handed == [{"a"}]


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("masters_blocks", [1, 2, 3, 5])
def test_the_plan_counts_as_read_again_what_the_engine_does_not_hand_over(inline, masters_blocks):
    prof = profile(layers=3, params=BLOCK // 2, vocab_params=BLOCK // 2)
    # layers of two tensors of one block of master each
    units = [u if u.kind != "layer" else dataclasses.replace(u, tensors=(f"{u.tensors[0]}.a", f"{u.tensors[0]}.b"))
             for u in prof.units]
    numel = {t: BLOCK // 4 if u.kind == "layer" else prof.tensor_numel[t] for u in units for t in u.tensors}
    prof = dataclasses.replace(prof, units=units, tensor_numel=numel, tensor_trainable=dict.fromkeys(numel, True))
    eager = SCHEDULES["eager"]
    sizes = OptimizerSizes(kind="t", grad_pool=0, read_ahead=0, writeback=0, masters=masters_blocks * BLOCK,
                           chunk=1 << 20)
    planned = masters_reread(prof, eager, sizes, dict.fromkeys(numel, Tier.SSD), inline=inline)
    engine_read = 0
    for u in units:
        state = _state(numel, sizes.masters)  # inline, the engine waits for the last unit's masters to go home
        names = list(dict.fromkeys(u.tensors))
        handed = state.hand_over(names, alone=inline)
        engine_read += sum(held_bytes(4 * numel[t]) for t in names if t not in handed)
    assert planned == engine_read
