"""The Trainer's extension points, answered by the offloaded engine.

``offload(trainer)`` makes the trainer an instance of a subclass of its own class with :class:`OffloadedTrainer`
in front (and :class:`OffloadedSFT` for TRL's ``SFTTrainer``): only this trainer changes, not transformers or TRL.
The methods it overrides are the ones the Trainer documents for subclasses, or small hooks of its loop:

    create_optimizer                the engine's optimizer as the Trainer's (terastack.hf.engine_optimizer)
    get_batch_samples, training_step
                                    the engine's step over the micro-batches of an optimizer step
                                    ([Note: the Trainer's step on the engine] in terastack.hf.offloaded_run)
    _clip_grad_norm, _get_grad_norm the norm the engine measured (it clipped)
    _inner_training_loop            the model's own activation checkpointing off (the engine's activation policy
                                    carries ``gradient_checkpointing``)
    prediction_step                 evaluation on the engine's weights
    _save, _save_optimizer_and_scheduler, _load_from_checkpoint, _load_optimizer_and_scheduler, _load_best_model
                                    the model and the engine's state in checkpoint-N folders ([Note: checkpoint-N
                                    under the engine] in terastack.hf.checkpoint_files)
    log                             terastack's figures in each training log line
"""
from __future__ import annotations

import os

import torch

from terastack.hf.checkpoint_files import export_model, load_engine_state, save_engine_state
from terastack.hf.engine_optimizer import EngineOptimizer

#: the Trainer's own files (their names as transformers.trainer spells them)
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
TRAINING_ARGS_NAME = "training_args.bin"


class OffloadedTrainer:
    """The overrides every offloaded Trainer takes (it stands before the trainer's own class)."""

    terastack = None  # the OffloadedRun, set by offload()

    # ------------------------------------------------------------------ optimizer
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = EngineOptimizer(self.terastack.param_groups(), lr=self.args.learning_rate)
        return self.optimizer

    # ----------------------------------------------------------------------- step
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        samples, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.terastack.begin_group(samples, num_items)
        return samples, num_items

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()  # as the Trainer's own training_step does (an evaluation left the model in eval mode)
        return self.terastack.training_step(self, inputs)

    def _clip_grad_norm(self, model):
        return self.terastack.grad_norm

    def _get_grad_norm(self, model, grad_norm=None):
        return grad_norm if grad_norm is not None else self.terastack.grad_norm

    def _inner_training_loop(self, *args, **kwargs):
        quiet_model_checkpointing(self.terastack.causal_lm)
        return super()._inner_training_loop(*args, **kwargs)

    # ----------------------------------------------------------------- evaluation
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with self.terastack.forward():
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    # ------------------------------------------------------------ saving, resuming
    def _save(self, output_dir=None, state_dict=None):
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        export_model(self.terastack.engine, output_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        elif getattr(self.data_collator, "tokenizer", None) is not None:
            self.data_collator.tokenizer.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))  # as the Trainer's _save keeps it

    def _save_optimizer_and_scheduler(self, output_dir):
        save_engine_state(self.terastack.engine, output_dir)
        if self.args.should_save:  # the groups' learning rates (the engine's state holds the rest), the scheduler
            torch.save(self.optimizer.state_dict(), os.path.join(output_dir, OPTIMIZER_NAME))
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        load_engine_state(self.terastack.engine, resume_from_checkpoint)

    def _load_best_model(self):
        # load_best_model_at_end: the best checkpoint's engine state (its weights; training is over)
        load_engine_state(self.terastack.engine, self.state.best_model_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return
        for name, part in ((OPTIMIZER_NAME, self.optimizer), (SCHEDULER_NAME, self.lr_scheduler)):
            path = os.path.join(checkpoint, name)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"resume_from_checkpoint: {checkpoint} has no {name}")
            part.load_state_dict(torch.load(path, weights_only=True))

    # ----------------------------------------------------------------------- logs
    def log(self, logs, start_time=None):
        if "loss" in logs:  # a training log line: terastack's figures of the steps it covers
            logs.update(self.terastack.step_logs())
        return super().log(logs, start_time)


class OffloadedSFT(OffloadedTrainer):
    """TRL's ``SFTTrainer`` besides: its loss and figures in evaluation (terastack.hf.sft_logs)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from terastack.hf.sft_logs import eval_loss

        return eval_loss(self, model, self.terastack.causal_lm, inputs, return_outputs=return_outputs)


def quiet_model_checkpointing(causal_lm) -> None:
    """Turn the model's own activation checkpointing off (the Trainer turns it on at train()): the engine runs each
    decoder layer as a unit and recomputes by its activation policy, which ``gradient_checkpointing`` set."""
    if getattr(causal_lm, "is_activation_checkpointing", False):
        causal_lm._set_gradient_checkpointing(enable=False)
    if getattr(causal_lm, "_require_grads_hooks", None):
        causal_lm.disable_input_require_grads()


_CLASSES: dict[type, type] = {}


def offloaded_class(cls: type, kind: str) -> type:
    """The subclass of ``cls`` an offloaded trainer becomes (one per class)."""
    if cls not in _CLASSES:
        mixin = OffloadedSFT if kind == "sft" else OffloadedTrainer
        _CLASSES[cls] = type(f"Offloaded{cls.__name__}", (mixin, cls), {"__module__": cls.__module__})
    return _CLASSES[cls]
