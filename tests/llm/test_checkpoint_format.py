"""A checkpoint written before the trainer's parts saved themselves still resumes.

``data/old_checkpoint`` was written by the code at commit c9ae8ec (``data/make_old_checkpoint.py``): a tiny
GPT-2 (dropout: the RNG state matters) after two steps with clipping, and ``old_checkpoint_expected.safetensors``
holds the weights and losses of the same run continued uninterrupted for two more steps, by that code.
"""
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from terastack.llm import Trainer
from terastack.llm.engine_state import open_checkpoint
from terastack.training.checkpoint import JSONState
from terastack.training.data.epochs import DataOrder
from terastack.training.engine_protocol import StepCount
from terastack.training.lr_schedule import LRSchedule

from .llm_helpers import batches

DATA = Path(__file__).parent / "data"
OLD = DATA / "old_checkpoint"


def _expected():
    with safe_open(str(DATA / "old_checkpoint_expected.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["losses"])


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_the_fixture_is_in_the_old_format():
    manifest = json.loads((OLD / "step-00000002" / "checkpoint.json").read_text())
    assert manifest["format"] == "terastack.llm.checkpoint" and manifest["version"] == 1
    assert "components" not in manifest and {"trainer", "extra", "model"} <= set(manifest)
    assert sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file()) < 1 << 20


def test_old_checkpoint_resumes_to_the_uninterrupted_run(trainer_config):
    expected, expected_losses = _expected()
    before = _digest(OLD)
    extra = JSONState()
    with Trainer.load_checkpoint(OLD, trainer_config(max_grad_norm=1.0), components={"extra": extra}) as t:
        assert t.step_count == 2 and extra.value == {"note": "written by the code at commit c9ae8ec"}
        assert t.lr == pytest.approx(1e-3) and set(t.optimizer.steps.values()) == {2}
        losses = [t.step(ids) for ids in batches(4)[2:]]
        got = t.state_dict()
    assert losses == pytest.approx(expected_losses, rel=1e-6)
    assert got.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-6, msg=k)
    assert _digest(OLD) == before  # resuming reads, never writes


def test_old_checkpoint_resaved_resumes_alike(tmp_path, trainer_config):
    """Resumed from the old format and saved in the new one at once, it continues to the same weights."""
    expected, _ = _expected()
    with Trainer.load_checkpoint(OLD, trainer_config(max_grad_norm=1.0)) as t:
        t.save_checkpoint(tmp_path / "new")
    manifest = json.loads((tmp_path / "new" / "step-00000002" / "checkpoint.json").read_text())
    assert manifest["format"] == "terastack.checkpoint"
    with Trainer.load_checkpoint(tmp_path / "new", trainer_config(max_grad_norm=1.0)) as t:
        for ids in batches(4)[2:]:
            t.step(ids)
        got = t.state_dict()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-6, msg=k)


def test_old_checkpoint_loop_state_continues_the_job():
    """The loop state the old format kept in ``extra`` loads into the loop's own components."""
    snap = open_checkpoint(OLD)
    state, order = StepCount(), DataOrder(seed=0, batch_size=2, rows_per_epoch=8)
    schedule = LRSchedule(LRSchedule.Config(kind="constant", lr=1e-3, total_steps=4))
    assert snap.load({"loop": state, "data_order": order, "lr_schedule": schedule}) == \
        ["loop", "data_order", "lr_schedule"]
    assert state.step == 2 and order.micro_batches == 2 and order.epoch == pytest.approx(0.5)
    assert schedule.changed_since_saved() == []
    longer = LRSchedule(LRSchedule.Config(kind="constant", lr=1e-3, total_steps=6))
    snap.load({"lr_schedule": longer})
    assert longer.changed_since_saved() == ["total_steps"]
    with pytest.raises(ValueError, match="data order has seed 0, this job 1"):
        snap.load({"data_order": DataOrder(seed=1, batch_size=2, rows_per_epoch=8)})
