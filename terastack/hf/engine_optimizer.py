"""The optimizer a Trainer holds when the offloaded engine trains its model.

[Note: who does what at the optimizer step]
The Trainer's loop calls, per optimizer step, ``training_step`` for each micro-batch, then clipping,
``optimizer.step()``, ``lr_scheduler.step()`` and ``model.zero_grad()``. Each is done exactly once:

    the schedule     the Trainer's: its ``lr_scheduler`` sets the learning rate in this optimizer's parameter
                     groups, and the engine reads it there before each step (every scheduler the Trainer builds,
                     with its kwargs and warmup, and ``ReduceLROnPlateau``, which steps on the metrics)
    forward, backward, the update
                     the engine's, all inside the first ``training_step`` of the step (the update runs during the
                     backward of the last micro-batch, or after it with clipping); the other micro-batches'
                     ``training_step`` return their share of the loss
    clipping         the engine's (``max_grad_norm``: the clip coefficient of ``clip_grad_norm_``, before the
                     updates); the Trainer's clipping call returns the norm the engine measured
    ``optimizer.step()``
                     counts the step; the engine updated already
    ``zero_grad()``  nothing to do: the engine's gradients never rest on the model's parameters

The parameter groups are the Trainer's own (``get_decay_parameter_names``: the decayed weights, and biases and
norms without weight decay), over the model's (meta) parameters; the engine exempts the second group from
weight decay as torch's AdamW does.
"""
from __future__ import annotations

import torch


class EngineOptimizer(torch.optim.Optimizer):
    """The Trainer's optimizer over the engine: see [Note: who does what at the optimizer step]."""

    def __init__(self, groups: list[dict], *, lr: float):
        super().__init__(groups, {"lr": lr, "weight_decay": 0.0})
        #: optimizer steps the Trainer took
        self.steps = 0

    @property
    def lr(self) -> float:
        """The learning rate of the next step (one for every group, as the Trainer's schedulers set it)."""
        rates = {float(g["lr"]) for g in self.param_groups}
        if len(rates) != 1:
            raise ValueError(f"the optimizer's parameter groups have learning rates {sorted(rates)}; the offloaded "
                             "engine trains every parameter at one rate a step")
        return rates.pop()

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("optimizer.step(closure): the offloaded engine runs forward and backward in the "
                             "Trainer's training_step; a closure is not served")
        self.steps += 1
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None
