"""The optimizer's schedules at their edges (equality with plain AdamW is test_equality.py's)."""
import pytest
import torch

from terastack.llm import Trainer
from terastack.llm.engine.schedules import AfterBackward, Deferred, Eager, EagerInline

from .llm_helpers import batches, make_model, offloaded_train


@pytest.mark.parametrize("active_offload", [True, False], ids=["deferred", "after_backward"])
def test_clipping_step_without_any_gradient(active_offload, tmp_path, trainer_config):
    """A step in which no trainable tensor got a gradient: with clipping on, the global norm is 0 (as
    clip_grad_norm_ says for no gradients), nothing is updated and no step count moves."""
    make_model("llama", tmp_path / "model", layers=2)
    cfg = trainer_config(max_grad_norm=1.0, active_offload=active_offload)
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        opt = trainer.optimizer
        before = {n: trainer.parameter(n) for n in list(trainer.tensors)[:2]}
        opt.begin_step()
        opt.begin_backward()
        opt.end_step()  # backward delivered nothing
        opt.synchronize()
        assert opt.last_grad_norm == 0.0
        assert set(opt.steps.values()) == {0}
        for n, t in before.items():
            assert torch.equal(trainer.parameter(n), t)
        offloaded_train(trainer, batches(1))  # and the next real step still runs
        trainer.synchronize()
        assert set(opt.steps.values()) == {1}


@pytest.mark.parametrize("kw, schedule", [({}, EagerInline), ({"inline_updates": False}, Eager),
                                          ({"max_grad_norm": 1.0}, Deferred), ({"active_offload": False},
                                                                               AfterBackward)])
def test_config_chooses_the_schedule(kw, schedule, tmp_path, trainer_config):
    make_model("llama", tmp_path / "model", layers=1)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(**kw)) as trainer:
        assert type(trainer.optimizer.schedule) is schedule
        assert trainer.optimizer.inline is (schedule is EagerInline)
