"""What offload() cannot serve is refused in one line naming it and what is served, before the model is touched."""
import pytest
import torch

from .hf_helpers import offload, pad_collate, tiny_model, token_rows


def make(tmp_path, cls=None, model=None, **kw):
    from transformers import Trainer, TrainingArguments

    trainer_kw = {k: kw.pop(k) for k in ("compute_loss_func", "optimizers") if k in kw}
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, max_steps=1, **kw)
    return (cls or Trainer)(model=model if model is not None else tiny_model("llama"), args=args,
                            train_dataset=token_rows(4), data_collator=pad_collate, **trainer_kw)


def refused(trainer, tmp_path, hardware, match, **settings):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(ValueError, match=match) as info:
        offload(trainer, tmp_path, hardware, **settings)
    assert "\n" not in str(info.value)
    # refused before anything moved: the model keeps its weights, and its class
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert not hasattr(trainer, "terastack") or trainer.terastack is None
    return str(info.value)


def test_an_optimizer_without_an_equal(tmp_path, hardware_file):
    msg = refused(make(tmp_path, optim="adafactor"), tmp_path, hardware_file, "optim='adafactor' has no equal")
    assert "served: adamw_torch, adamw_torch_fused, adamw_bnb_8bit, adamw_8bit" in msg


def test_a_compute_loss_override(tmp_path, hardware_file):
    from transformers import Trainer

    class FocalTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch) ** 2

    msg = refused(make(tmp_path, FocalTrainer), tmp_path, hardware_file,
                  "FocalTrainer overrides compute_loss .*FocalTrainer.compute_loss")
    assert "served: transformers.Trainer and TRL's SFTTrainer" in msg


@pytest.mark.parametrize("kw, match", [
    ({"compute_loss_func": lambda outputs, labels, num_items_in_batch=None: outputs.loss}, "compute_loss_func"),
    ({"label_smoothing_factor": 0.1}, "label_smoothing_factor=0.1"),
    ({"optim_args": "foo=1"}, "optim_args='foo=1'"),
    ({"neftune_noise_alpha": 5.0}, "neftune_noise_alpha"),
    ({"optimizers": "mine"}, "an optimizer or scheduler given to the Trainer"),
], ids=["compute_loss_func", "label_smoothing", "optim_args", "neftune", "optimizers"])
def test_what_changes_the_loss_or_the_optimizer(kw, match, tmp_path, hardware_file):
    if kw.get("optimizers") == "mine":
        model = tiny_model("llama")
        kw = {"model": model, "optimizers": (torch.optim.SGD(model.parameters(), lr=0.1), None)}
    refused(make(tmp_path, **kw), tmp_path, hardware_file, match)


def test_several_processes_point_to_dist_train(tmp_path, hardware_file, monkeypatch):
    from transformers import TrainingArguments

    trainer = make(tmp_path)
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 2))
    msg = refused(trainer, tmp_path, hardware_file, "2 processes")
    assert "terastack dist train" in msg


def test_accumulated_means_of_means(tmp_path, hardware_file):
    trainer = make(tmp_path, gradient_accumulation_steps=2)
    trainer.model_accepts_loss_kwargs = False  # a model whose forward takes no num_items_in_batch
    refused(trainer, tmp_path, hardware_file, "gradient_accumulation_steps=2 with a model whose forward takes no")


def test_a_model_that_is_not_a_causal_lm(tmp_path, hardware_file):
    class Regressor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, input_ids, labels=None, **kw):
            return {"loss": self.lin(input_ids.float()[..., :4]).mean()}

    msg = refused(make(tmp_path, model=Regressor()), tmp_path, hardware_file, "the Trainer's model is a Regressor")
    assert "served: a transformers causal LM" in msg


def test_a_model_with_a_loss_of_its_own(tmp_path, hardware_file):
    trainer = make(tmp_path)
    trainer.model.loss_function = lambda logits, labels, vocab_size, **kw: logits.float().pow(2).mean()
    refused(trainer, tmp_path, hardware_file, "LlamaForCausalLM computes its loss without transformers' causal-LM")


@pytest.mark.parametrize("settings, match", [({"lr": 1e-3}, "lr is set by learning_rate"),
                                             ({"weight_decay": 0.1}, "weight_decay is set by weight_decay"),
                                             ({"checkpoint_every": 2}, "checkpoint_every is not an engine setting"),
                                             ({"bogus": 1}, "bogus is not an engine setting")])
def test_settings_that_are_not_the_engines(settings, match, tmp_path, hardware_file):
    refused(make(tmp_path), tmp_path, hardware_file, match, **settings)


def test_an_offloaded_trainer_is_not_offloaded_again(tmp_path, hardware_file):
    trainer = offload(make(tmp_path), tmp_path, hardware_file)
    with pytest.raises(ValueError, match="offloaded already"):
        offload(trainer, tmp_path, hardware_file)
    trainer.terastack.close()


def test_a_budget_that_cannot_fit_leaves_the_model_as_it_was(tmp_path, hardware_file):
    """The plan is refused after the weights were taken off the model: they are put back, nothing is lost."""
    from terastack.plan.llm_plan import PlanError

    trainer = make(tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(PlanError, match="memory budget exceeded"):
        offload(trainer, tmp_path, hardware_file, memory_budget="16KiB")
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert type(trainer).__name__ == "Trainer"
    trainer.train()  # and the plain Trainer still trains it
