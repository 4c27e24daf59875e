"""Which optimizer window the planner takes when the host budget is tight ([Note: the optimizer's window])."""
from terastack.plan.llm_planner import LLMPlanner
from terastack.plan.optimizer_sizes import STREAM_WINDOW, size_candidates

from tests.plan.test_llm_planner import CPU, profile

MiB = 1 << 20


def _planner(host_budget: int) -> LLMPlanner:
    return LLMPlanner(LLMPlanner.Config(device_budget=4 << 30, host_budget=host_budget, inline_updates=True,
                                        state_placement="ssd"))


def test_a_unit_whose_masters_do_not_fit_beside_the_window_keeps_the_window_and_reads_them_again():
    # layers of 96M parameters: a unit's fp32 masters (384 MiB) take more than the window's two 128 MiB
    prof = profile(layers=4, params=96 << 20, act=MiB, fwd_s=0.05, vocab_params=1 << 20)
    planner = _planner(1 << 30)
    sizes = {s.kind: s for s in size_candidates(prof, planner.schedule, inline=True, chunk=1 << 20, passes=1)}
    handing, rereading = sizes["lean stream"], sizes["lean stream, masters re-read"]
    lean_handing, lean = sizes["lean"], sizes["lean, masters re-read"]
    assert rereading.read_ahead == handing.read_ahead == STREAM_WINDOW > lean.read_ahead == lean_handing.read_ahead
    assert rereading.masters == lean.masters < lean_handing.masters == handing.masters
    # a budget in which nothing takes a unit's masters from backward: the 128 MiB window or the 4 MiB one
    assert lean.host_bytes < rereading.host_bytes < lean_handing.host_bytes < handing.host_bytes
    budget = (rereading.host_bytes + lean_handing.host_bytes) // 2
    p = _planner(budget).plan(prof, CPU)
    assert p.read_ahead_bytes == STREAM_WINDOW
    # ... so the optimizer reads every layer's master again, and the prediction counts it
    layers_masters = 4 * (96 << 20) * 4
    assert p.prediction.bytes_by_kind["masters_read"] >= layers_masters
