"""What the job loop needs of an engine: :class:`TrainingEngine`, one small protocol that every engine that
runs a language-model job satisfies (the offloaded :class:`terastack.llm.Trainer` does, and so does the
disaggregated engine's :class:`terastack.disdp.job_engine.DisdpEngine` on its rank 0).

[Note: the engine protocol]
The loop (:mod:`terastack.training.loop`) owns everything a job does around an optimizer step: the data order,
the learning-rate schedule, accumulation, evaluation, metrics, checkpoints and the export. Of the engine it
needs only:

    lr                      the learning rate of the next step (the loop sets it from the schedule)
    step(**batch)           one optimizer step over one micro-batch (``input_ids``, ``labels``, ...); the loss
    step_accumulated(mbs)   one optimizer step over several micro-batches (gradient accumulation); the loss
    history                 per step, a record with the fields of :class:`StepRecord` (the metrics line)
    step_count              optimizer steps taken (after a resume: the checkpoint's)
    loss(input_ids, labels) the loss of a batch without training (validation)
    synchronize()           wait until every update in flight has landed
    save_checkpoint(dir, components=...)   a checkpoint of the engine's own parts and the loop's ``Stateful``
                            components (terastack.training.checkpoint); the loop resumes its components from the
                            same snapshot the engine was resumed from
    save_pretrained(dir, max_shard_size=...)   the trained model in Hugging Face format (the export)
    profile                 ``total_params`` and ``trainable_params`` (the model FLOPs of the metrics)

Nothing here names an engine: an engine is whatever has these members (``isinstance(x, TrainingEngine)``
checks that they are there).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class StepRecord(Protocol):
    """One optimizer step as the engine measured it."""

    step: int
    loss: float
    seconds: float
    tokens: int
    ssd_read_bytes: int
    ssd_write_bytes: int
    device_in_bytes: int
    grad_norm: float | None


@dataclass(slots=True)
class StepStats:
    """One optimizer step (all micro-batches of an accumulated one), the :class:`StepRecord` of every engine (the
    byte counters stay 0 where the engine moves no bytes between tiers; ``grad_norm`` None where it is not
    measured)."""

    step: int
    loss: float
    seconds: float
    tokens: int
    ssd_read_bytes: int = 0
    ssd_write_bytes: int = 0
    device_in_bytes: int = 0
    grad_norm: float | None = None
    #: SSD bytes by kind, read and written, where the engine keeps a ledger ([Note: the byte ledger] in
    #: terastack.llm.engine.byte_ledger)
    bytes_by_kind: dict = field(default_factory=dict)


@dataclass(slots=True)
class StepCount:
    """Optimizer steps taken, as a checkpoint component (``{"step": n}``): an engine's progress (its ``progress``
    component) and the loop's (its ``loop`` component) are both one of these."""

    step: int = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


class ParameterCounts(Protocol):
    total_params: int
    trainable_params: int


@runtime_checkable
class TrainingEngine(Protocol):
    """See [Note: the engine protocol]."""

    lr: float

    @property
    def step_count(self) -> int: ...

    @property
    def history(self) -> Sequence[StepRecord]: ...

    @property
    def profile(self) -> ParameterCounts: ...

    def step(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float: ...

    def step_accumulated(self, micro_batches: Sequence[Mapping]) -> float: ...

    def loss(self, input_ids, labels=None, attention_mask=None, position_ids=None) -> float: ...

    def synchronize(self) -> None: ...

    def save_checkpoint(self, path: str | os.PathLike, *, components: Mapping | None = None): ...

    def save_pretrained(self, path: str | os.PathLike, *, dtype: str | None = None, max_shard_size=...): ...
