"""Learning-rate schedules of ``terastack finetune``: constant, linear or cosine, each after a linear warmup.

[Note: learning-rate schedules]
The learning rate of optimizer step ``s`` (0-based) is ``lr * factor(s)``, with the factors of transformers'
``get_constant_schedule_with_warmup``, ``get_linear_schedule_with_warmup`` and
``get_cosine_schedule_with_warmup`` (one half cosine), so a job moved from the Hugging Face Trainer keeps its
schedule step for step:

    warmup (s < W)        factor = s / max(1, W)            (the first step of a warmup trains at lr 0)
    constant (s >= W)     factor = 1
    linear   (s >= W)     factor = max(0, (T - s) / max(1, T - W))
    cosine   (s >= W)     factor = 0.5 * (1 + cos(pi * (s - W) / max(1, T - W)))

``T`` is the job's number of optimizer steps. The decay reaches its floor at ``s = T``, one step after the
last one, as in transformers. ``min_lr`` lifts the floor of the decaying schedules: after the warmup the factor
is ``f * (1 - min_lr / lr) + min_lr / lr`` (transformers' ``get_cosine_with_min_lr_schedule_with_warmup`` for
cosine; the same mapping for linear). The schedule is a pure function of the step, so a resumed run continues
it exactly.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SCHEDULES = ("constant", "linear", "cosine")


def warmup_from_ratio(ratio: float, total_steps: int) -> int:
    """Warmup steps for a share of the job (rounded up, as transformers' ``TrainingArguments`` does)."""
    if not 0 <= ratio <= 1:
        raise ValueError(f"warmup_ratio: must be in [0, 1], got {ratio}")
    return math.ceil(total_steps * ratio)


class LRSchedule:
    """``schedule.lr_at(step)``: the learning rate of optimizer step ``step``. See [Note: learning-rate
    schedules]."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        kind: str = "constant"
        #: the peak learning rate (reached at the end of the warmup)
        lr: float
        total_steps: int
        warmup_steps: int = 0
        #: the floor the linear and cosine decays approach (0: decay to zero)
        min_lr: float = 0.0

        def __post_init__(self) -> None:
            if self.kind not in SCHEDULES:
                raise ValueError(f"lr_schedule: must be one of {', '.join(SCHEDULES)}; got {self.kind!r}")
            if not self.lr >= 0:
                raise ValueError(f"lr: must be >= 0, got {self.lr}")
            if self.total_steps < 1:
                raise ValueError(f"total steps: must be >= 1, got {self.total_steps}")
            if self.warmup_steps < 0:
                raise ValueError(f"warmup_steps: must be >= 0, got {self.warmup_steps}")
            if not 0 <= self.min_lr <= self.lr:
                raise ValueError(f"min_lr: must be in [0, lr = {self.lr}], got {self.min_lr}")

    def __init__(self, config: Config):
        self.config = config
        #: the settings of the checkpoint this job resumed (see load_state_dict)
        self.saved: dict | None = None

    def factor(self, step: int) -> float:
        c = self.config
        if step < c.warmup_steps:
            return step / max(1, c.warmup_steps)
        if c.kind == "constant":
            return 1.0
        span = max(1, c.total_steps - c.warmup_steps)
        if c.kind == "linear":
            f = max(0.0, (c.total_steps - step) / span)
        else:
            f = max(0.0, 0.5 * (1.0 + math.cos(math.pi * (step - c.warmup_steps) / span)))
        floor = c.min_lr / c.lr if c.lr else 0.0
        return f * (1 - floor) + floor

    def lr_at(self, step: int) -> float:
        return self.config.lr * self.factor(step)

    def to_dict(self) -> dict:
        return asdict(self.config)

    # A checkpoint's part: the schedule is a pure function of the step, so its state is its settings. A resumed
    # job keeps its own (it may have been given more steps); what the checkpoint's were stays beside them.
    def state_dict(self) -> dict:
        return self.to_dict()

    def load_state_dict(self, state: dict) -> None:
        self.saved = dict(state)

    def changed_since_saved(self) -> list[str]:
        """The settings that differ from the loaded checkpoint's (none when nothing was loaded)."""
        if self.saved is None:
            return []
        return [k for k, v in self.to_dict().items() if self.saved.get(k) != v]
