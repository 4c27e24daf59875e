"""The LLM planner's choices and predictions on synthetic profiles (no model, no transformers)."""
import pytest

from terastack.plan.hardware import PRESETS, Hardware
from terastack.plan.llm_planner import LLMPlanner, ModelProfile, PlanError
from terastack.plan.llm_profile import UnitProfile

MiB = 1 << 20


def profile(layers=8, params=1 << 20, act=8 * MiB, fwd_s=0.01, vocab_params=2 << 20, compute_bytes=4):
    units = [UnitProfile(name="embed", kind="pre", tensors=("embed",), params=vocab_params, trainable=vocab_params,
                         weight_bytes=vocab_params * compute_bytes, fwd_flops=0, bwd_flops=0, act_bytes=4096,
                         boundary_bytes=0, fwd_s=1e-4, bwd_s=1e-4)]
    numel = {"embed": vocab_params}
    for i in range(layers):
        units.append(UnitProfile(name=f"layers.{i}", kind="layer", tensors=(f"l{i}",), params=params,
                                 trainable=params, weight_bytes=params * compute_bytes, fwd_flops=1e9, bwd_flops=2e9,
                                 act_bytes=act, boundary_bytes=MiB // 2, act_tensors=10, fwd_s=fwd_s,
                                 bwd_s=2 * fwd_s))
        numel[f"l{i}"] = params
    units.append(UnitProfile(name="head", kind="post", tensors=("head",), params=vocab_params,
                             trainable=vocab_params, weight_bytes=vocab_params * compute_bytes, fwd_flops=1e9,
                             bwd_flops=2e9, act_bytes=MiB // 2, boundary_bytes=MiB // 2, fwd_s=1e-3, bwd_s=2e-3))
    numel["head"] = vocab_params
    return ModelProfile(model="synthetic", batch=1, seq_len=256, compute_bytes=compute_bytes, units=units,
                        tensor_numel=numel, tensor_trainable={n: True for n in numel}, logits_bytes=MiB)


CPU = Hardware(name="cpu", measured=True, cores=2, host_memory_bytes=16 << 30, cpu_flops=5e10,
               memcpy_bytes_per_s=5e9, ssd_read_bytes_per_s=2e9, ssd_write_bytes_per_s=1e9,
               cpu_adam_params_per_s=3e8)


def plan(prof, hw=CPU, **kw):
    kw.setdefault("device_budget", 1 << 30)
    kw.setdefault("host_budget", 1 << 30)
    return LLMPlanner(LLMPlanner.Config(**kw)).plan(prof, hw)


def test_plenty_of_memory_keeps_everything_and_state_on_host():
    p = plan(profile())
    assert set(p.policies) == {"keep"}
    assert set(p.state_home.values()) == {"host"}
    assert p.prediction.ssd_read_bytes == 0 and p.prediction.bottleneck.startswith("CPU")


def test_tight_device_budget_recomputes_or_swaps_the_first_layers():
    prof = profile()
    p = plan(prof, device_budget=60 * MiB)
    layer_pols = [pol for pol, u in zip(p.policies, prof.units) if u.kind == "layer"]
    assert "keep" in layer_pols and set(layer_pols) - {"keep"}
    # keeping is cheapest, so kept layers are the last ones (their backward comes first)
    first_keep = layer_pols.index("keep")
    assert all(pol == "keep" for pol in layer_pols[first_keep:])
    assert p.prediction.device_peak_bytes + p.prediction.transient_bytes <= 60 * MiB


def test_swap_vs_recompute_follows_the_cost_of_each():
    prof = profile(fwd_s=1.0)  # recomputing costs a second per layer; the SSD is idle: swap wins
    p = plan(prof, device_budget=64 * MiB)
    assert "recompute" not in p.policies and {"ssd", "host"} & set(p.policies)
    slow_ssd = CPU.with_overrides(ssd_read_bytes_per_s=1e6, ssd_write_bytes_per_s=1e6)
    cheap = profile(fwd_s=1e-4)  # recomputation is nearly free and the SSD crawls: recompute (or host) wins
    p2 = plan(cheap, slow_ssd, device_budget=40 * MiB, host_budget=256 * MiB)
    assert "ssd" not in p2.policies


def test_host_budget_splits_state_between_host_and_ssd():
    prof = profile()
    full = plan(prof).prediction
    p = plan(prof, host_budget=160 * MiB)
    homes = set(p.state_home.values())
    assert homes == {"host", "ssd"}
    assert p.prediction.host_peak_bytes <= 160 * MiB
    assert p.prediction.ssd_read_bytes > full.ssd_read_bytes
    all_ssd = plan(prof, host_budget=160 * MiB, state_placement="ssd")
    assert set(all_ssd.state_home.values()) == {"ssd"}


def test_refusal_names_budget_and_shortfall():
    with pytest.raises(PlanError) as info:
        plan(profile(), device_budget=4 * MiB)
    assert info.value.budget == "device" and info.value.shortfall > 0 and "short by" in str(info.value)
    with pytest.raises(PlanError) as info:
        plan(profile(), host_budget=MiB)
    assert info.value.budget == "host" and "gradients in flight" in str(info.value)


def test_modes_and_ablation_predictions():
    prof = profile()
    eager = plan(prof, host_budget=160 * MiB, state_placement="ssd").prediction
    after = plan(prof, host_budget=160 * MiB, state_placement="ssd", optimizer_schedule="after_backward").prediction
    assert after.step_s > eager.step_s  # the optimizer no longer hides behind backward
    planner = LLMPlanner(LLMPlanner.Config(device_budget=1 << 30, host_budget=1 << 30))
    rec = planner.predict(prof, CPU, tuple("keep" if u.kind != "layer" else "recompute" for u in prof.units))
    keep = planner.predict(prof, CPU, tuple("keep" for _ in prof.units))
    assert rec.compute_s == pytest.approx(keep.compute_s + 8 * 0.01)


def test_inline_updates_budget_a_unit_of_state_read_ahead_and_written():
    """Inline updates (no accelerator) read one unit's moments ahead and write one unit's back; the optimizer
    thread works two 1M-element chunks at a time. Both come out of the host budget. Inline, the optimizer holds
    one unit's fp32 masters (handed over, its update comes next); the thread, the largest and two units'."""
    prof = profile(params=4 << 20, vocab_params=3 << 20)
    unit_moments = 2 * (4 << 20) * 4  # the largest unit: exp_avg + exp_avg_sq of 4M fp32 elements
    chunk_pair = 2 * 2 * (1 << 20) * 4
    threaded = plan(prof, host_budget=512 * MiB, state_placement="ssd")
    inline = plan(prof, host_budget=512 * MiB, state_placement="ssd", inline_updates=True)
    assert (threaded.read_ahead_bytes, threaded.writeback_bytes) == (chunk_pair, chunk_pair)
    assert (inline.read_ahead_bytes, inline.writeback_bytes) == (unit_moments, unit_moments)
    assert inline.inline_updates and not threaded.inline_updates
    unit_masters = (4 << 20) * 4
    assert (inline.masters_bytes, threaded.masters_bytes) == (unit_masters, 3 * unit_masters)
    assert (inline.prediction.host_peak_bytes - threaded.prediction.host_peak_bytes
            == 2 * (unit_moments - chunk_pair) - 2 * unit_masters)
    # deferred updates (clipping) gather the gradients first: never inline
    assert not plan(prof, host_budget=512 * MiB, inline_updates=True, optimizer_schedule="deferred").inline_updates


def test_ssd_traffic_slows_cpu_compute_by_the_probed_rate():
    """Without an accelerator the step solves s = O + C (1 + k B / s) (see [Note: the step-time model])."""
    prof = profile()
    base = plan(prof, host_budget=160 * MiB, state_placement="ssd").prediction
    k = 0.1
    slowed = plan(prof, CPU.with_overrides(cpu_io_slowdown_per_gbps=k), host_budget=160 * MiB,
                  state_placement="ssd").prediction
    c, o = slowed.compute_s, slowed.optimizer_s + slowed.host_copy_s
    gb = (slowed.ssd_read_bytes + slowed.ssd_write_bytes) / 1e9
    cpu = (c + o + ((c + o) ** 2 + 4 * k * c * gb) ** 0.5) / 2
    assert slowed.io_slowdown_s == pytest.approx(cpu - c - o)
    assert slowed.step_s == pytest.approx(max(cpu, slowed.ssd_s) + slowed.exposed_s)
    assert cpu == pytest.approx(o + c * (1 + k * gb / cpu))  # the fixed point itself
    assert base.io_slowdown_s == 0 and slowed.step_s > base.step_s
    # an accelerator computes apart from the CPU's memory system: no slowdown is applied
    gpu = PRESETS["rtx4090-workstation"].with_overrides(cpu_io_slowdown_per_gbps=k)
    assert plan(prof, gpu, host_budget=160 * MiB, state_placement="ssd").prediction.io_slowdown_s == 0


def test_gpu_step_is_the_slowest_pipeline_and_labelled_a_prediction():
    gpu = PRESETS["rtx4090-workstation"]
    prof = profile(compute_bytes=2)
    for u in prof.units:
        u.fwd_s = u.bwd_s = None
    p = plan(prof, gpu, device_budget=20 << 30, host_budget=200 << 30)
    pred = p.prediction
    assert pred.prediction is True
    assert pred.step_s >= max(pred.compute_s, pred.device_link_s, pred.ssd_s, pred.optimizer_s)
    assert pred.tokens_per_s == pytest.approx(256 / pred.step_s)


def test_config_is_validated():
    with pytest.raises(ValueError, match="policy"):
        LLMPlanner.Config(device_budget=1, host_budget=1, policy="swap")
    with pytest.raises(ValueError, match="optimizer_schedule"):
        LLMPlanner.Config(device_budget=1, host_budget=1, optimizer_schedule="lazy")
    with pytest.raises(ValueError, match="device_budget"):
        LLMPlanner.Config(device_budget="much", host_budget=1)


def test_state_homes_of_one_candidate_do_not_leak_into_another():
    """Candidates of one search share placements of the state by the host room left to it; an earlier candidate's
    placement must not answer a later one that has less room (the room left over after it is not its room)."""
    prof = profile(act=12 * MiB)  # a layer's activations take what its state does: 12 B x 1M parameters
    all_keep = tuple("keep" for _ in prof.units)
    five_host = tuple("host" if u.kind == "layer" and int(u.name.split(".")[1]) < 5 else "keep" for u in prof.units)
    # the optimizer's own host memory: all state on the SSD leaves nothing else on the host
    fixed = plan(prof, policy=all_keep, state_placement="ssd").prediction.host_peak_bytes
    # 64 MiB of room: all-keep rests the embedding's state (24 MiB) and three layers' (36 MiB) on the host and
    # leaves 4 MiB; swapping five layers' activations (60 MiB, their 10 storages each padded to a 4 KiB block) to
    # the host leaves less than that 4 MiB of room
    kw = dict(device_budget=1 << 30, host_budget=fixed + 64 * MiB)
    shared = LLMPlanner(LLMPlanner.Config(**kw))
    first = shared.predict(prof, CPU, all_keep)
    assert first.host_peak_bytes == fixed + 60 * MiB
    second = shared.predict(prof, CPU, five_host)
    alone = LLMPlanner(LLMPlanner.Config(**kw)).predict(prof, CPU, five_host)
    assert second == alone
    assert second.host_peak_bytes == fixed + 60 * MiB + 5 * 10 * 4096 <= kw["host_budget"]  # all state on the SSD


def tied(prof):
    """``prof`` with the head using the embedding's tensor (tied input and output embeddings)."""
    units = [u if u.name != "head" else UnitProfile(**{**{f: getattr(u, f) for f in u.__slots__},
                                                      "tensors": ("embed",), "trainable": 0})
             for u in prof.units]
    numel = {n: v for n, v in prof.tensor_numel.items() if n != "head"}
    return ModelProfile(model=prof.model, batch=prof.batch, seq_len=prof.seq_len, compute_bytes=prof.compute_bytes,
                        units=units, tensor_numel=numel, tensor_trainable={n: True for n in numel},
                        logits_bytes=prof.logits_bytes)


def test_gradient_pool_holds_a_tied_embedding_through_backward():
    """A tied embedding's gradient is held from the head's backward (first) to the embedding's (last): every
    layer's gradients arrive beside it, so the pool is at least one layer's plus the embedding's."""
    from terastack.plan.llm_profile import gradients_in_flight

    prof = profile(layers=3, params=1 << 20, vocab_params=1 << 19)
    assert gradients_in_flight(prof, slack=False) == 4 << 20  # untied: the largest unit's gradients
    assert gradients_in_flight(prof) == 8 << 20               # ... and the second largest's
    t = tied(prof)
    assert gradients_in_flight(t, slack=False) == (4 << 20) + (2 << 20)
    assert gradients_in_flight(t) == (4 << 20) + (2 << 20) + (4 << 20)
    # a host budget between the untied and the tied lean pool: the tied model is refused, naming the pool
    with pytest.raises(PlanError) as refused:
        plan(t, host_budget=1 << 20, state_placement="ssd")
    budget = refused.value.needed - 1  # the tied model's smallest host need, less a byte
    plan(prof, host_budget=budget, state_placement="ssd")
    with pytest.raises(PlanError, match="host budget exceeded.*gradients in flight"):
        plan(t, host_budget=budget, state_placement="ssd")


def _lora_like(layers=8, frozen=64 << 20):
    """A bf16 profile whose decoder layers are frozen (a LoRA base): each layer holds ``frozen`` parameters and a
    small trainable adapter."""
    import dataclasses

    prof = profile(layers=layers, params=frozen, compute_bytes=2, fwd_s=1e-4)  # not compute-bound
    units, numel, trainable = [], dict(prof.tensor_numel), dict(prof.tensor_trainable)
    for u in prof.units:
        if u.kind == "layer":
            adapter = f"{u.tensors[0]}.lora"
            numel[adapter], trainable[adapter], trainable[u.tensors[0]] = 4096, True, False
            u = dataclasses.replace(u, tensors=(*u.tensors, adapter), params=u.params + 4096, trainable=4096,
                                    weight_bytes=u.weight_bytes + 4096 * 2)
        units.append(u)
    return dataclasses.replace(prof, units=units, tensor_numel=numel, tensor_trainable=trainable)


def test_frozen_weights_stay_on_a_device_they_fit():
    """[Note: frozen weights on the device]: the base of a LoRA fine-tune rests in the device tier when it fits
    there (nothing of it crosses the device link or leaves the SSD); on a device too small it streams."""
    from terastack.plan.llm_planner import held_bytes
    from terastack.tier import Tier

    prof = _lora_like()
    frozen = [n for n, t in prof.tensor_trainable.items() if not t]
    frozen_bytes = sum(held_bytes(prof.tensor_numel[n] * 2) for n in frozen)  # 8 x 128 MiB
    gpu = PRESETS["rtx4090-workstation"]
    big = plan(prof, gpu, device_budget=4 << 30, host_budget=256 * MiB)  # the base does not fit the host
    assert {big.compute_home[n] for n in frozen} == {Tier.DEVICE}
    p = big.prediction
    assert p.device_peak_bytes >= frozen_bytes and p.device_peak_bytes + p.transient_bytes <= 4 << 30
    assert p.ssd_read_bytes < 64 * MiB  # only the adapters' state, none of the base
    assert p.device_link_bytes < 64 * MiB
    assert big.placement_bytes(prof)["compute_device"] == sum(prof.tensor_numel[n] * 2 for n in frozen)
    small = plan(prof, gpu, device_budget=800 * MiB, host_budget=256 * MiB)  # 1 GiB of base: it must stream
    assert Tier.DEVICE not in {small.compute_home[n] for n in frozen}
    assert small.prediction.device_link_bytes >= 2 * frozen_bytes and small.prediction.ssd_read_bytes > 0
    assert big.prediction.step_s < small.prediction.step_s
    # without an accelerator the device tier is host memory: a frozen weight homed in host memory is read in place
    cpu = plan(prof, CPU, device_budget=4 << 30, host_budget=4 << 30)
    assert Tier.DEVICE not in set(cpu.compute_home.values())
    # and the planner can be told to stream them
    off = plan(prof, gpu, device_budget=4 << 30, host_budget=256 * MiB, frozen_on_device=False)
    assert Tier.DEVICE not in {off.compute_home[n] for n in frozen}


def test_pinned_staging_is_planned_inside_the_host_budget_on_an_accelerator():
    """With an accelerator every SSD transfer is staged through pinned host memory that the store reserves in
    its host ledger: the planner keeps room for it inside the host budget (it used to come on top)."""
    from terastack.plan.staging import staging_cap

    prof = profile()
    gpu = CPU.with_overrides(gpu_flops=1e14, gpu_memory_bytes=8 << 30, pcie_bytes_per_s=2e10)
    budget = 256 * MiB
    cap = staging_cap(max(prof.tensor_numel.values()) * prof.compute_bytes, budget)
    on_cpu = plan(prof, host_budget=budget, state_placement="ssd", policy="keep")
    on_gpu = plan(prof, gpu, host_budget=budget, state_placement="ssd", policy="keep")
    assert on_gpu.prediction.host_peak_bytes - on_cpu.prediction.host_peak_bytes == cap
    assert on_gpu.prediction.host_peak_bytes <= budget
    # a budget with room for everything but the staging: the accelerator's plan stays inside it (a smaller cap,
    # leaner optimizer sizes) or is refused naming the staging, never past it
    tight = on_cpu.prediction.host_peak_bytes + cap // 2
    try:
        squeezed = plan(prof, gpu, host_budget=tight, state_placement="ssd", policy="keep")
    except PlanError as exc:
        assert "pinned staging" in str(exc)
    else:
        assert squeezed.prediction.host_peak_bytes <= tight


def test_device_weights_are_priced_at_the_caching_allocators_size_on_a_gpu(monkeypatch):
    """[Note: the device ledger and the caching allocator] (terastack.allocator): on a GPU the store's device
    ledger charges each record the caching allocator's block, so the plan counts the same: a record just over
    10 MiB takes a segment of its own rounded up to 2 MiB; with expandable segments only 512-byte rounding."""
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    record = 10 * MiB + 4096                      # a layer's fp32 weights: whole store blocks, awkward to CUDA
    prof = profile(params=record // 4)           # the embedding and head (8 MiB each) round to themselves
    gpu = CPU.with_overrides(gpu_flops=1e14, gpu_memory_bytes=8 << 30, pcie_bytes_per_s=2e10)
    on_cpu = plan(prof, policy="keep", retain_weights=False).prediction
    on_gpu = plan(prof, gpu, policy="keep", retain_weights=False).prediction
    window = 2                                    # prefetch depth 1: two layers' weights in flight
    assert on_gpu.device_peak_bytes - on_cpu.device_peak_bytes == window * (12 * MiB - record)
    # a device budget that holds the records' bytes but not the allocator's blocks: on a GPU, one layer in
    # flight instead of two; with no prefetch asked, a refusal
    budget = on_cpu.device_peak_bytes + on_cpu.transient_bytes
    assert plan(prof, policy="keep", retain_weights=False, device_budget=budget).prefetch_depth == 1
    assert plan(prof, gpu, policy="keep", retain_weights=False, device_budget=budget).prefetch_depth == 0
    alone = plan(prof, policy="keep", retain_weights=False, prefetch_depth=0).prediction
    budget = alone.device_peak_bytes + alone.transient_bytes
    plan(prof, policy="keep", retain_weights=False, prefetch_depth=0, device_budget=budget)
    with pytest.raises(PlanError, match="device budget exceeded"):
        plan(prof, gpu, policy="keep", retain_weights=False, prefetch_depth=0, device_budget=budget)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    expandable = plan(prof, gpu, policy="keep", retain_weights=False).prediction
    assert expandable.device_peak_bytes == on_cpu.device_peak_bytes  # whole 4 KiB blocks: no rounding left
