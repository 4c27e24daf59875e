"""The loop that drives a language-model job on any engine: schedule, accumulation, validation, metrics,
checkpoints. It reaches the engine only through :class:`~terastack.training.engine_protocol.TrainingEngine`
([Note: the engine protocol]).

[Note: the finetune loop]
One loop, read top to bottom in :meth:`FinetuneLoop.run`:

    prologue      the loop state (step, micro-batches consumed) from the resumed checkpoint (``resume``)
                  or zero; a validation loss before training
    step s        lr = schedule(s) (set on the trainer); the next ``grad_accum`` micro-batches of the data
                  order ([Note: the data order of a job]); one optimizer step over them; a metrics line;
                  a validation loss every ``eval_every`` steps; a checkpoint every ``checkpoint_every`` steps
    epilogue      a validation loss at the end (unless the last step just had one); the final checkpoint

A checkpoint stores, beside the trainer's components, the loop's (:meth:`FinetuneLoop.checkpoint_components`):
``loop`` (the step), ``data_order`` (seed, micro-batch size, micro-batches consumed), ``lr_schedule`` (its
settings) and ``data`` (the training data's description). With the schedule a pure function of the step and
the data order a pure function of (seed, micro-batch), a resumed job takes exactly the steps the uninterrupted
one would.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from terastack.training.data.epochs import DataOrder
from terastack.training.engine_protocol import TrainingEngine
from terastack.training.lr_schedule import LRSchedule, warmup_from_ratio
from terastack.training.metrics import MetricsLog, count_tokens, eval_record, model_flops_per_token, step_record
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

    @classmethod
    def from_job(cls, job, *, total_steps: int, rows_per_epoch: int) -> "LoopConfig":
        """The loop of ``job`` (a :class:`~terastack.training.job.JobConfig`) once its data is known."""
        return cls(total_steps=total_steps, batch_size=job.training.batch_size, grad_accum=job.training.grad_accum,
                   rows_per_epoch=rows_per_epoch, eval_every=job.validation.every,
                   checkpoint_dir=job.checkpoint.dir, checkpoint_every=job.checkpoint.every)


def job_schedule(job, *, lr: float, total_steps: int) -> LRSchedule:
    """The learning-rate schedule of ``job`` at peak ``lr`` (the engine's, when the job leaves it unset)."""
    t = job.training
    warmup = t.warmup_steps if t.warmup_steps is not None else warmup_from_ratio(t.warmup_ratio or 0.0, total_steps)
    return LRSchedule(LRSchedule.Config(kind=t.lr_schedule, lr=lr, total_steps=total_steps, warmup_steps=warmup,
                                        min_lr=t.min_lr))


@dataclass(slots=True)
class LoopState:
    """Where the job stands: optimizer steps taken (the micro-batches consumed: :class:`DataOrder`)."""

    step: int = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


class DataSource:
    """The training data's description (``info``: its source and sha256): a resumed job trains on the same."""

    def __init__(self, info: dict | None):
        self.info = dict(info or {})

    def state_dict(self) -> dict:
        return dict(self.info)

    def load_state_dict(self, state: dict) -> None:
        if state.get("sha256") not in (None, self.info.get("sha256")):
            raise ValueError(f"--resume: the checkpoint was trained on other data ({state.get('source')}); give "
                             "the same --data")


#: the loop's components in a checkpoint (any may be absent: a checkpoint of the trainer alone has none)
LOOP_COMPONENTS = ("loop", "data_order", "lr_schedule", "data")


def loop_components_from_extra(extra: dict) -> dict[str, dict]:
    """The loop's component states of a checkpoint written before they saved themselves, when its loop state was
    the ``"loop"`` entry of its ``extra`` and the data's description the ``"data"`` entry (both taken out)."""
    out = {}
    saved = extra.pop("loop", None)
    if saved is not None:
        out["loop"] = {"step": saved["step"]}
        out["data_order"] = {"seed": saved.get("seed"), "batch_size": saved.get("batch_size"),
                             "micro_batches": saved["micro_batches"]}
        if "schedule" in saved:
            out["lr_schedule"] = saved["schedule"]
    if "data" in extra:
        out["data"] = extra.pop("data")
    return out


@dataclass(slots=True)
class LoopResult:
    first_step: int
    losses: list[float] = field(default_factory=list)
    #: (step, validation loss) of every evaluation
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    train_seconds: float = 0.0
    #: tokens of the steps taken: real ones (no padding) and those in the loss
    tokens: int = 0
    target_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LastCheckpoint:
    """The newest checkpoint a job can resume from: its directory and step."""

    path: str
    step: int


class FinetuneLoop:
    """Runs a job's optimizer steps on ``trainer``, any :class:`TrainingEngine` (see [Note: the finetune loop]).

    ``data``: micro-batch ``i`` is ``data.step_inputs(i)`` (a mapping of ``Trainer.step`` arguments) and
    ``data.seed`` its order's seed; ``val_batches``: ``(input_ids, labels)`` pairs; ``data_info``: the data's
    description, stored with every checkpoint and checked on resume. A trainer already past step 0 continues at
    one micro-batch per step unless :meth:`resume` loads the loop's state of its checkpoint."""

    def __init__(self, trainer: TrainingEngine, data, schedule: LRSchedule, config: LoopConfig, *, val_batches=(),
                 metrics: MetricsLog | None = None, log=None, data_info: dict | None = None,
                 label: str = "finetune"):
        self.trainer, self.data, self.schedule, self.config = trainer, data, schedule, config
        self.val_batches = list(val_batches)
        self.metrics = metrics or MetricsLog(None)
        self.log = log
        self.label = label  # the progress lines' word (the command)
        self.data_source = DataSource(data_info)
        self.flops_per_token = model_flops_per_token(trainer.profile.total_params, trainer.profile.trainable_params)
        step = trainer.step_count
        self.state = LoopState(step=step)
        #: the newest checkpoint of this job (the resumed one until this run writes one); None: none yet
        self.last_checkpoint: LastCheckpoint | None = None
        #: (real, target) tokens of the last optimizer step
        self.last_tokens = (0, 0)
        self.order = DataOrder(seed=data.seed, batch_size=config.batch_size, rows_per_epoch=config.rows_per_epoch,
                               micro_batches=step)

    # ---------------------------------------------------------------- state
    def checkpoint_components(self) -> dict:
        """The loop's ``Stateful`` parts of a checkpoint (see [Note: the finetune loop])."""
        return {"loop": self.state, "data_order": self.order, "lr_schedule": self.schedule,
                "data": self.data_source}

    def resume(self, snapshot, *, path=None) -> None:
        """Continue the job of ``snapshot`` (a ``terastack.training.checkpoint.Snapshot``: the checkpoint the
        trainer was resumed from; ``path``: the checkpoint directory as the user named it). Refuses a data order
        that would not continue the checkpoint's."""
        step = self.trainer.step_count
        loaded = snapshot.load(self.checkpoint_components(), optional=LOOP_COMPONENTS)
        self.last_checkpoint = LastCheckpoint(str(path or snapshot.path), step)
        if "loop" not in loaded:  # a checkpoint of the trainer alone: one micro-batch per step
            self.state.step, self.order.micro_batches = step, step
        elif self.state.step != step:
            raise ValueError(f"--resume: the checkpoint's loop state is at step {self.state.step} but its trainer "
                             f"at step {step}")
        changed = self.schedule.changed_since_saved()
        if changed and self.log is not None:
            print(f"--resume: the learning-rate schedule differs from the checkpoint's ({', '.join(changed)}); "
                  "it continues with this job's", file=self.log)

    @property
    def epoch(self) -> float:
        """Epochs done (fractional): rows consumed over rows per epoch."""
        return self.order.epoch

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
        self.trainer.save_checkpoint(self.config.checkpoint_dir, components=self.checkpoint_components())
        self.last_checkpoint = LastCheckpoint(str(self.config.checkpoint_dir), self.state.step)

    def optimizer_step(self) -> float:
        """One optimizer step over the next ``grad_accum`` micro-batches at the schedule's learning rate."""
        c, s = self.config, self.state
        self.trainer.lr = self.schedule.lr_at(s.step)
        micro = [self.data.step_inputs(self.order.micro_batches + k) for k in range(c.grad_accum)]
        self.last_tokens = count_tokens(micro, pad_id=getattr(self.data, "pad_id", None))
        loss = self.trainer.step(**micro[0]) if c.grad_accum == 1 else self.trainer.step_accumulated(micro)
        s.step += 1
        self.order.micro_batches += c.grad_accum
        return loss

    # ------------------------------------------------------------------- loop
    def run(self) -> LoopResult:
        c, s, trainer = self.config, self.state, self.trainer
        result = LoopResult(first_step=s.step)
        # prologue
        self.evaluate(result, "before training" if s.step == 0 else f"at step {s.step} (resumed)")
        # a resumed job shows its true position: 51/120, not 1/70
        progress = Progress(c.total_steps, initial=min(s.step, c.total_steps), label=self.label, unit="step",
                            stream=self.log, log_every=5.0, enabled=self.log is not None)
        t0 = time.perf_counter()
        # steady state
        while s.step < c.total_steps:
            lr = self.schedule.lr_at(s.step)
            loss = self.optimizer_step()
            result.losses.append(loss)
            h = trainer.history[-1]
            tokens, targets = self.last_tokens
            result.tokens += tokens
            result.target_tokens += targets
            self.metrics.write(step_record(h, epoch=self.epoch, lr=lr, flops_per_token=self.flops_per_token,
                                           tokens=tokens, target_tokens=targets))
            progress.update(1, loss=loss, lr=lr, **{"tok/s": tokens / h.seconds,
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
