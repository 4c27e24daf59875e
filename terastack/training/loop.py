"""The training loop of ``terastack finetune``: schedule, accumulation, validation, metrics, checkpoints.

[Note: the finetune loop]
One loop, read top to bottom in :meth:`FinetuneLoop.run`:

    prologue      the loop state (step, micro-batches consumed) from the resumed checkpoint or zero;
                  a validation loss before training
    step s        lr = schedule(s) (set on the trainer); the next ``grad_accum`` micro-batches of the data
                  order ([Note: the data order of a job]); one optimizer step over them; a metrics line;
                  a validation loss every ``eval_every`` steps; a checkpoint every ``checkpoint_every`` steps
    epilogue      a validation loss at the end (unless the last step just had one); the final checkpoint

A checkpoint stores the loop state in its ``extra`` (``"loop"``): the step, the micro-batches consumed, the
micro-batch size, the data seed and the schedule. With the schedule a pure function of the step and the data
order a pure function of (seed, micro-batch), a resumed job takes exactly the steps the uninterrupted one would.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from terastack.training.lr_schedule import LRSchedule
from terastack.training.metrics import MetricsLog, eval_record, model_flops_per_token, step_record
from terastack.training.data.examples import validation_loss
from terastack.progress import Progress


@dataclass(kw_only=True, slots=True)
class LoopConfig:
    total_steps: int
    #: rows per micro-batch and micro-batches per optimizer step
    batch_size: int
    grad_accum: int = 1
    #: training rows in one epoch (token windows or examples)
    rows_per_epoch: int
    #: validation every N steps (0: before training and at the end only)
    eval_every: int = 0
    checkpoint_dir: str | None = None
    #: checkpoint every N steps (0: at the end only, when ``checkpoint_dir`` is set)
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        for name in ("total_steps", "batch_size", "grad_accum", "rows_per_epoch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")


@dataclass(slots=True)
class LoopState:
    """Where the job stands: optimizer steps taken and micro-batches of the data order consumed."""

    step: int = 0
    micro_batches: int = 0


@dataclass(slots=True)
class LoopResult:
    first_step: int
    losses: list[float] = field(default_factory=list)
    #: (step, validation loss) of every evaluation
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    train_seconds: float = 0.0


class FinetuneLoop:
    """Runs a job's optimizer steps on ``trainer`` (see [Note: the finetune loop]).

    ``data``: micro-batch ``i`` is ``data.step_inputs(i)`` (a mapping of ``Trainer.step`` arguments) and
    ``data.seed`` its order's seed; ``val_batches``: ``(input_ids, labels)`` pairs; ``checkpoint_extra``: what
    every checkpoint stores besides the loop state (the data's description)."""

    def __init__(self, trainer, data, schedule: LRSchedule, config: LoopConfig, *, val_batches=(),
                 metrics: MetricsLog | None = None, log=None, checkpoint_extra: dict | None = None):
        self.trainer, self.data, self.schedule, self.config = trainer, data, schedule, config
        self.val_batches = list(val_batches)
        self.metrics = metrics or MetricsLog(None)
        self.log = log
        self.checkpoint_extra = dict(checkpoint_extra or {})
        self.flops_per_token = model_flops_per_token(trainer.profile.total_params, trainer.profile.trainable_params)
        self.state = self._restored_state()

    # ---------------------------------------------------------------- state
    def _restored_state(self) -> LoopState:
        """The loop state of a resumed trainer's checkpoint (zero for a fresh one); refuses a data order that
        would not continue the checkpoint's."""
        step = self.trainer.step_count
        saved = self.trainer.resumed_extra.get("loop")
        if step == 0:
            return LoopState()
        if saved is None:  # a checkpoint written before loop states: one micro-batch per step
            return LoopState(step=step, micro_batches=step)
        for key, mine in (("batch_size", self.config.batch_size), ("seed", self.data.seed)):
            if saved.get(key) != mine:
                raise ValueError(f"--resume: the checkpoint's data order has {key} {saved.get(key)}, this job "
                                 f"{mine}; give the same value to continue it")
        if saved.get("step") != step:
            raise ValueError(f"--resume: the checkpoint's loop state is at step {saved.get('step')} but its trainer "
                             f"at step {step}")
        if saved.get("schedule") != self.schedule.to_dict() and self.log is not None:
            changed = [k for k, v in self.schedule.to_dict().items() if saved.get("schedule", {}).get(k) != v]
            print(f"--resume: the learning-rate schedule differs from the checkpoint's ({', '.join(changed)}); "
                  "it continues with this job's", file=self.log)
        return LoopState(step=step, micro_batches=int(saved["micro_batches"]))

    def loop_extra(self) -> dict:
        return {**asdict(self.state), "batch_size": self.config.batch_size, "grad_accum": self.config.grad_accum,
                "seed": self.data.seed, "schedule": self.schedule.to_dict()}

    @property
    def epoch(self) -> float:
        """Epochs done (fractional): rows consumed over rows per epoch."""
        return self.state.micro_batches * self.config.batch_size / self.config.rows_per_epoch

    # ----------------------------------------------------------------- pieces
    def evaluate(self, result: LoopResult, when: str | None = None) -> float | None:
        if not self.val_batches:
            return None
        loss = validation_loss(self.trainer, self.val_batches)
        result.evaluations.append((self.state.step, loss))
        record = eval_record(self.state.step, loss)
        self.metrics.write(record)
        if self.log is not None:
            print(f"validation loss {when or f'at step {self.state.step}'}: {loss:.4f} (perplexity "
                  f"{record['val_ppl']:.4g})", file=self.log)
        return loss

    def checkpoint(self) -> None:
        self.trainer.save_checkpoint(self.config.checkpoint_dir,
                                     extra={**self.checkpoint_extra, "loop": self.loop_extra()})

    def optimizer_step(self) -> float:
        """One optimizer step over the next ``grad_accum`` micro-batches at the schedule's learning rate."""
        c, s = self.config, self.state
        self.trainer.lr = self.schedule.lr_at(s.step)
        micro = [self.data.step_inputs(s.micro_batches + k) for k in range(c.grad_accum)]
        loss = self.trainer.step(**micro[0]) if c.grad_accum == 1 else self.trainer.step_accumulated(micro)
        s.step += 1
        s.micro_batches += c.grad_accum
        return loss

    # ------------------------------------------------------------------- loop
    def run(self) -> LoopResult:
        c, s, trainer = self.config, self.state, self.trainer
        result = LoopResult(first_step=s.step)
        # prologue
        self.evaluate(result, "before training" if s.step == 0 else f"at step {s.step} (resumed)")
        progress = Progress(max(0, c.total_steps - s.step), label="finetune", unit="step", stream=self.log,
                            log_every=5.0, enabled=self.log is not None)
        t0 = time.perf_counter()
        # steady state
        while s.step < c.total_steps:
            lr = self.schedule.lr_at(s.step)
            loss = self.optimizer_step()
            result.losses.append(loss)
            h = trainer.history[-1]
            self.metrics.write(step_record(h, epoch=self.epoch, lr=lr, flops_per_token=self.flops_per_token))
            progress.update(1, loss=loss, lr=lr, **{"tok/s": h.tokens / h.seconds,
                                                    "ssd r MB/s": h.ssd_read_bytes / h.seconds / 1e6,
                                                    "ssd w MB/s": h.ssd_write_bytes / h.seconds / 1e6})
            if c.eval_every and s.step % c.eval_every == 0 and s.step < c.total_steps:
                self.evaluate(result)
            if c.checkpoint_dir and c.checkpoint_every and s.step % c.checkpoint_every == 0:
                self.checkpoint()
        progress.close()
        trainer.synchronize()
        result.train_seconds = time.perf_counter() - t0
        # epilogue
        if self.val_batches and (not result.evaluations or result.evaluations[-1][0] != s.step):
            self.evaluate(result)
        if c.checkpoint_dir and (not c.checkpoint_every or s.step % c.checkpoint_every):
            self.checkpoint()
        return result


def perplexity(loss: float | None) -> float | None:
    return None if loss is None else (math.exp(loss) if loss < 700 else math.inf)
