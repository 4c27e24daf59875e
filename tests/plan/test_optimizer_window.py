"""Which optimizer window the planner takes when the host budget is tight ([Note: the optimizer's window])."""
import dataclasses

import pytest

from terastack.plan.llm_planner import LLMPlanner
from terastack.plan.optimizer_sizes import STREAM_WINDOW, size_candidates

from tests.plan.test_llm_planner import CPU, profile

MiB = 1 << 20


def _split_layers(prof):
    """``prof`` with each layer's weights in two tensors of half its parameters (a decoder layer has several):
    a unit's masters then take more than the largest master."""
    units, numel = [], {}
    for u in prof.units:
        if u.kind == "layer":
            names = tuple(f"{t}.{half}" for t in u.tensors for half in "ab")
            numel.update({n: u.params // 2 for n in names})
            u = dataclasses.replace(u, tensors=names)
        else:
            numel.update({t: prof.tensor_numel[t] for t in u.tensors})
        units.append(u)
    return dataclasses.replace(prof, units=units, tensor_numel=numel, tensor_trainable=dict.fromkeys(numel, True))


def _planner(host_budget: int) -> LLMPlanner:
    return LLMPlanner(LLMPlanner.Config(device_budget=4 << 30, host_budget=host_budget, inline_updates=True,
                                        state_placement="ssd"))


def test_a_unit_whose_masters_do_not_fit_beside_the_window_keeps_the_window_and_reads_them_again():
    # layers of 96M parameters in two tensors: a unit's fp32 masters (384 MiB) take more than the window's two
    # 128 MiB, and more than the one master (192 MiB) the update keeps room to read
    prof = _split_layers(profile(layers=4, params=96 << 20, act=MiB, fwd_s=0.05, vocab_params=1 << 20))
    planner = _planner(1 << 30)
    sizes = {s.kind: s for s in size_candidates(prof, planner.schedule, inline=True, chunk=1 << 20, passes=1)}
    handing, rereading = sizes["lean stream"], sizes["lean stream, masters re-read"]
    lean_handing, lean = sizes["lean"], sizes["lean, masters re-read"]
    assert rereading.read_ahead == handing.read_ahead == STREAM_WINDOW > lean.read_ahead == lean_handing.read_ahead
    assert rereading.masters == lean.masters < lean_handing.masters == handing.masters
    # a budget in which the 128 MiB window cannot take a unit's masters from backward, the 4 MiB one can
    assert lean.host_bytes < lean_handing.host_bytes < rereading.host_bytes < handing.host_bytes
    budget = (rereading.host_bytes + handing.host_bytes) // 2
    # a disk whose reads are fast beside the 4 MiB window's many requests: reading the masters again is cheaper
    p = _planner(budget).plan(prof, dataclasses.replace(CPU, ssd_read_bytes_per_s=8e9))
    assert p.read_ahead_bytes == STREAM_WINDOW
    # ... so the optimizer reads every layer's master again, and the prediction counts it
    layers_masters = 4 * (96 << 20) * 4
    assert p.prediction.bytes_by_kind["masters_read"] >= layers_masters


def test_a_small_window_pays_for_every_request_it_issues():
    from terastack.plan.optimizer_sizes import STATE_REQUEST_CPU_S, exposed_state_io_s
    from terastack.tier import Tier

    prof = _split_layers(profile(layers=4, params=96 << 20, act=MiB, fwd_s=0.05, vocab_params=1 << 20))
    planner = _planner(1 << 30)
    sizes = {s.kind: s for s in size_candidates(prof, planner.schedule, inline=True, chunk=1 << 20, passes=1)}
    homes = {t: Tier.SSD for t in prof.tensor_numel}
    # with a disk of unbounded speed, only the requests cost: each unit's state a window (read) or an allowance
    # (written) at a time
    cost = {k: exposed_state_io_s(prof, planner.schedule, s, homes, read_bw=float("inf"), write_bw=float("inf"))
            for k, s in sizes.items()}
    lean, stream = sizes["lean, masters re-read"], sizes["lean stream, masters re-read"]
    state = [96 << 20] * 4 + [1 << 20, 1 << 20]  # elements whose moments each unit (layers, embedding, head) reads
    per_chunk = planner.schedule.records_per_chunk(False)

    def requests(s):
        return sum(-(-per_chunk * 4 * n // s.read_ahead) + -(-per_chunk * 4 * n // s.writeback) for n in state)

    assert cost["lean, masters re-read"] == pytest.approx(requests(lean) * STATE_REQUEST_CPU_S)
    assert cost["lean, masters re-read"] > 10 * cost["lean stream, masters re-read"]
    assert cost["lean stream, masters re-read"] == pytest.approx(requests(stream) * STATE_REQUEST_CPU_S)


@pytest.mark.parametrize("compute_bytes", [4, 2])
def test_a_frozen_embedding_and_head_do_not_size_the_optimizers_working_set(compute_bytes):
    """Under LoRA the 128k-row embedding and output head are frozen: they have no optimizer records, so the
    working set (chunks, masters, the rebuilt compute copy in mixed precision) is the trainable tensors' alone,
    whatever the frozen tensors' size."""
    def frozen_vocab(vocab_params):
        prof = profile(layers=4, params=MiB, act=MiB, vocab_params=vocab_params, compute_bytes=compute_bytes)
        trainable = {t: t not in ("embed", "head") for t in prof.tensor_numel}
        units = [dataclasses.replace(u, trainable=0) if u.kind != "layer" else u for u in prof.units]
        return dataclasses.replace(prof, units=units, tensor_trainable=trainable)

    planner = _planner(1 << 30)
    small, huge = (size_candidates(frozen_vocab(v), planner.schedule, inline=True, chunk=1 << 20, passes=1)
                   for v in (MiB, 512 * MiB))
    assert [s.host_bytes for s in huge] == [s.host_bytes for s in small]
    # the trainable layers' state and masters, not a 512M-element frozen tensor's (2 GiB in bf16, 4 in fp32)
    assert max(s.host_bytes for s in huge) < 64 * MiB
