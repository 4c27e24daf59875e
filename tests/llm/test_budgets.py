"""Budgets are contracts: the ledgers' peaks stay within the plan's formulas, which stay within the budgets.

Every case here must train (building the trainer raises if the plan is refused) and each counts the steps it
ran, so no case passes on a refusal."""
import pytest
import torch

from .llm_helpers import batches, make_model
from terastack.llm import Trainer
from terastack.plan.llm_planner import held_bytes


@pytest.mark.parametrize("policy,placement", [("keep", "ssd"), ("recompute", "auto"), ("ssd", "ssd"),
                                              ("host", "auto"), ("keep,host,ssd,recompute", "ssd")])
def test_ledger_peaks_within_plan(policy, placement, tmp_path, trainer_config):
    make_model("llama", tmp_path / "model", layers=4)
    cfg = trainer_config(activation_policy=policy, state_placement=placement, device_budget="4MiB",
                         host_budget="3MiB")
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        for ids in batches(3):
            t.step(ids)
        t.synchronize()
        assert len(t.history) == 3  # every step ran under the plan
        plan, pred, use = t.plan, t.plan.prediction, t.usage()
        # device: weights of (depth + 1) units in flight + activations kept/in flight (the planner's formula)
        window = max(sum(u.weight_bytes for u in t.profile.units[i:i + plan.prefetch_depth + 1])
                     for i in range(len(t.profile.units)))
        kept = sum(u.act_bytes for u, p in zip(t.profile.units, plan.policies) if p == "keep")
        assert use["device"]["peak"] <= pred.device_peak_bytes
        assert pred.device_peak_bytes >= window + kept
        assert pred.device_peak_bytes + pred.transient_bytes <= plan.device_budget
        # host: the store's host ledger and the gradient pool together stay within the host budget
        assert use["grad_pool"]["peak"] <= plan.grad_pool_bytes
        assert use["host"]["peak"] <= pred.host_peak_bytes - plan.grad_pool_bytes
        assert pred.host_peak_bytes <= plan.host_budget
        # what rests in host memory at the end is the state the plan placed there
        resting = sum(held_bytes(r.nbytes) for r in map(t.store.record, t.store.names())
                      if r.home.value == "host")
        assert use["host"]["used"] == resting


@pytest.mark.parametrize("policy,placement,optimizer", [("keep", "ssd", "adamw"), ("ssd", "ssd", "adamw"),
                                                        ("keep", "ssd", "adafactor")])
def test_each_write_back_had_room_made_for_it(policy, placement, optimizer, tmp_path, trainer_config, monkeypatch):
    """Whatever the disk's pace, the write-backs in flight stay within the allowance only if room was made for every
    group before it was sent home: made chunk by chunk, a unit's group of chunks joined the previous unit's writes
    still in flight and the host peak passed the plan's on a slow disk ([Note: a group's write-back is made room
    for whole]). Counted, not timed: each group sent must be no larger than the room made last before it."""
    from terastack.llm.engine.optimizer_state import OptimizerState

    made, groups = [], []
    throttle, write_back = OptimizerState.throttle_writebacks, OptimizerState.write_back

    def spy_throttle(self, incoming):
        made.append(incoming)
        return throttle(self, incoming)

    def spy_write_back(self, recs):
        groups.append((len(recs), sum(self.store.padded(r) for r in recs), made[-1] if made else 0))
        made.clear()
        return write_back(self, recs)
    monkeypatch.setattr(OptimizerState, "throttle_writebacks", spy_throttle)
    monkeypatch.setattr(OptimizerState, "write_back", spy_write_back)
    make_model("llama", tmp_path / "model", layers=2)
    cfg = trainer_config(activation_policy=policy, state_placement=placement, device_budget="4MiB",
                         host_budget="3MiB", optimizer=optimizer)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        for ids in batches(2):
            t.step(ids)
        t.synchronize()
    assert max(n for n, _, _ in groups) > 2  # groups of several chunks' state were sent, not one chunk's
    for _, sent, room in groups:
        assert sent <= room, (sent, room)


def test_weights_stream_one_unit_ahead(tmp_path, trainer_config):
    """With prefetch depth 1 and decoder layers recomputed, the device holds at most two units' weights (plus
    the inputs kept for recomputation and the small activations of the other units) at any time."""
    make_model("llama", tmp_path / "model", layers=8)
    cfg = trainer_config(activation_policy="recompute", state_placement="ssd", prefetch_depth=1,
                         retain_weights=False)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
        for ids in batches(2):
            t.step(ids)
        assert len(t.history) == 2
        units = t.profile.units
        two = max(units[i].weight_bytes + units[i + 1].weight_bytes for i in range(len(units) - 1))
        boundary = sum(u.boundary_bytes for u in units if u.kind == "layer")
        kept = sum(u.act_bytes for u in units if u.kind != "layer")  # embedding, norm and head keep theirs
        peak = t.usage()["device"]["peak"]
        assert peak <= two + boundary + kept
        total = sum(u.weight_bytes for u in units)
        assert peak < total / 2  # the model's weights were never all on the device


def test_weights_kept_for_the_next_forward_save_reads(tmp_path, trainer_config):
    """The first units' updated masters stay in the device tier (within the planned peak): the next forward
    reads less from the SSD than without them, and the result is the same."""
    make_model("llama", tmp_path / "model", layers=8)
    data = batches(3)
    reads, weights = {}, {}
    for retain in (False, True):
        cfg = trainer_config(state_placement="ssd", device_budget="1MiB", retain_weights=retain,
                             store_dir=str(tmp_path / f"store-{retain}"))
        with Trainer.from_pretrained(tmp_path / "model", cfg) as t:
            for ids in data:
                t.step(ids)
            t.synchronize()
            assert len(t.history) == len(data)
            reads[retain] = t.history[-1].ssd_read_bytes
            weights[retain] = t.state_dict()
            assert bool(t.plan.retained_units) == retain
            assert t.usage()["device"]["peak"] <= t.plan.prediction.device_peak_bytes
    assert reads[True] < reads[False]
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in weights[False])
