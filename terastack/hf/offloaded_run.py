"""The offloaded engine under a Trainer: one optimizer step per group of micro-batches the Trainer's loop takes.

[Note: the Trainer's step on the engine]
The Trainer's loop (``_run_epoch``) takes the micro-batches of an optimizer step from its data loader all at once
(``get_batch_samples``) and then calls ``training_step`` for each. The first of those calls runs the engine's step
over all of them -- ``Trainer.step`` for one, ``Trainer.step_accumulated`` for several, the very calls
``terastack finetune``'s loop makes, so the engine's order (vertical where it fits), schedule and clipping are
finetune's -- at the learning rate the Trainer's scheduler has set. Each ``training_step`` returns its own
micro-batch's share of the loss ([Note: a micro-batch's figures inside one engine step] in
terastack.hf.step_figures). Nothing else runs a step: there is no loop here.
"""
from __future__ import annotations

import contextlib

import torch

from terastack.hf.engine_optimizer import EngineOptimizer
from terastack.hf.step_figures import StepFigures

#: keys of a batch the engine takes
BATCH_KEYS = ("input_ids", "labels", "attention_mask", "position_ids")
#: keys a padding-free collator adds for flash attention's kernels; sdpa and eager attention derive the same from the
#: position ids, so they are left out
VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


class OffloadedRun:
    """The engine (a :class:`terastack.llm.Trainer`) and the Trainer-side state of its steps. ``trainer.terastack``
    is this object: ``engine`` for the weights (``engine.parameter(name)``) and the plan, ``close()`` to remove
    the store's scratch directory before the process ends."""

    def __init__(self, engine, *, causal_lm, kind: str):
        self.engine = engine
        self.causal_lm = causal_lm
        self.kind = kind
        self._group: list | None = None
        self._num_items = None
        self._next = 0
        self._losses: list[float] = []
        #: the engine's history index of the first step not yet in a training log
        self.logged_steps = 0

    # ------------------------------------------------------------------ the step
    def begin_group(self, samples: list, num_items) -> None:
        """The micro-batches of the Trainer's next optimizer step (before any of their ``training_step``)."""
        self._group, self._num_items, self._next, self._losses = list(samples), num_items, 0, []

    def training_step(self, trainer, inputs) -> torch.Tensor:
        """The Trainer's ``training_step`` for ``inputs``: the engine's step on the first micro-batch of a group
        ([Note: the Trainer's step on the engine]); this micro-batch's loss."""
        group, i = self._group, self._next
        if group is None or i >= len(group) or inputs is not group[i]:
            raise RuntimeError("training_step outside the Trainer's loop: the offloaded engine runs whole "
                               "optimizer steps over the micro-batches the loop takes (call trainer.train())")
        if i == 0:
            self._losses = self.step(trainer, group)
        self._next += 1
        return torch.tensor(self._losses[i], device=trainer.args.device)

    def step(self, trainer, group: list) -> list[float]:
        """One engine step over ``group``; each micro-batch's loss."""
        engine = self.engine
        batches = [self.batch(mb) for mb in group]
        engine.lr = engine_optimizer(trainer.optimizer).lr
        figures = StepFigures([b["input_ids"].shape[0] for b in batches])
        with figures.reading(self.causal_lm):
            if len(batches) == 1 and engine.plan.grad_accum == 1:
                engine.step(**batches[0])
            else:
                engine.step_accumulated(batches)
        if self.kind == "sft":
            from terastack.hf.sft_logs import record_train_figures

            record_train_figures(trainer, figures, batches)
        num_items = self._num_items
        return figures.losses(None if num_items is None else float(num_items))

    def batch(self, inputs: dict) -> dict:
        """The engine's keyword arguments of one micro-batch (labels required, as the Trainer's loss needs them)."""
        unknown = sorted(set(inputs) - set(BATCH_KEYS) - set(VARLEN_KEYS) - {"use_cache"})
        if unknown:
            raise ValueError(f"batch key {unknown[0]!r}: the offloaded engine takes {', '.join(BATCH_KEYS)} "
                             "(remove_unused_columns=True drops the dataset's other columns)")
        if "labels" not in inputs:
            raise ValueError("batch without labels: the Trainer's loss needs them (a language-modeling collator "
                             "adds them)")
        return {k: inputs[k] for k in BATCH_KEYS if inputs.get(k) is not None}

    def param_groups(self) -> list[dict]:
        """The Trainer's two parameter groups over the engine's tensors: the decayed weights and the no-decay group
        (the model's parameter objects, found through the units that use them)."""
        engine = self.engine
        param_of = {unit.tensors[local]: p for unit in engine.units
                    for local, p in unit.module.named_parameters(remove_duplicate=False)}
        exempt = engine.optimizer.config.no_decay
        trainable = [n for n, info in sorted(engine.tensors.items(), key=lambda kv: kv[1].index) if info.trainable]
        return [{"params": [param_of[n] for n in trainable if n not in exempt],
                 "weight_decay": engine.optimizer.config.weight_decay},
                {"params": [param_of[n] for n in trainable if n in exempt], "weight_decay": 0.0}]

    @property
    def grad_norm(self) -> float | None:
        """The global gradient norm of the last step (before clipping), where the engine clipped."""
        return self.engine.optimizer.last_grad_norm

    # -------------------------------------------------------------- outside steps
    @contextlib.contextmanager
    def forward(self):
        """Within: the model's forward runs on the engine's weights outside a training step (evaluation): every
        update in flight lands first, and the weights it fetched are let go after."""
        engine = self.engine
        if engine.resumed_point is not None:
            raise RuntimeError("the engine resumed inside a step: train on before evaluating")
        engine.synchronize()
        fetcher = engine.runtime.fetcher
        fetcher.begin_forward()
        try:
            yield
        finally:
            fetcher.sweep()

    # ---------------------------------------------------------------------- logs
    def step_logs(self) -> dict[str, float]:
        """terastack's figures over the steps since the last training log: tokens per second and SSD bytes per
        step, read and written."""
        hist = list(self.engine.history[self.logged_steps:])
        self.logged_steps = len(self.engine.history)
        if not hist:
            return {}
        seconds = sum(h.seconds for h in hist)
        return {"tokens_per_s": sum(h.tokens for h in hist) / seconds if seconds > 0 else 0.0,
                "ssd_read_bytes_per_step": sum(h.ssd_read_bytes for h in hist) / len(hist),
                "ssd_write_bytes_per_step": sum(h.ssd_write_bytes for h in hist) / len(hist)}

    def close(self) -> None:
        """Stop the engine and remove its store's scratch directory."""
        self.engine.close()


def engine_optimizer(optimizer) -> EngineOptimizer:
    """The engine's optimizer inside the Trainer's (accelerate wraps it: ``AcceleratedOptimizer.optimizer``)."""
    while not isinstance(optimizer, EngineOptimizer):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None:
            raise ValueError(f"the Trainer's optimizer is a {type(optimizer).__name__}, not the offloaded engine's "
                             "(a trainer's optimizer was replaced after offload())")
        optimizer = inner
    return optimizer
