"""The one job runner: everything a language-model job does around its engine, whichever engine that is.

``terastack finetune`` (the offloaded engine) and ``terastack dist train`` (the disaggregated engine, on its
rank 0) both call :meth:`JobRunner.run` with their :class:`EngineChoice`; each command is that choice plus what
only it prints.

[Note: the job runner]
One run, top to bottom in :meth:`JobRunner.run`:

    the model       resolved once (a built-in name, a directory, a Hub id in the local cache; RoPE scaling)
    the peak lr     the job's, else :func:`default_lr` by whether the model is pretrained and LoRA trains
    the data        tokenized, split, its steps counted; the learning-rate schedule over those steps
    resume          the checkpoint opened and its data checked (other data is refused before any engine is
                    built); the engine and then the loop load their parts from that one snapshot
    the engine      built by the choice (``EngineChoice.open``), which also announces it
    the loop        :class:`~terastack.training.loop.FinetuneLoop` with the metrics log and the output's
                    ``DIR.partial/``; checkpoints as the job asks
    the export      the output directory replaced in one step, ``finetune.yaml`` (the job as run: its
                    learning rate and seed spelled out, files absolute, no resume) inside
    the result      one dictionary: the job's figures, then the engine's own (``EngineChoice.result``)

Ctrl-C anywhere raises :class:`~terastack.training.interrupt.JobInterrupted` carrying one line: the step
reached, the newest checkpoint and the command that resumes from it ([Note: an interrupted run]).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from terastack.training.interrupt import JobInterrupted, interrupted_line
from terastack.units import format_bytes

#: the peak learning rate when the job gives none ([Note: default learning rates])
LR_FROM_SCRATCH, LR_PRETRAINED, LR_LORA = 3e-4, 1e-5, 1e-4


def default_lr(*, pretrained: bool, lora: bool) -> float:
    """[Note: default learning rates]
    A model trained from a random initialization takes 3e-4; fine-tuning all weights of a pretrained model
    1e-5; a LoRA adapter 1e-4 (its weights start at zero and are few: the rate peft's examples and the common
    fine-tuners use, 1e-4 to 2e-4, whatever the base). Every engine takes its default from here."""
    return LR_LORA if lora else LR_PRETRAINED if pretrained else LR_FROM_SCRATCH


#: room counted beside an export's weights and tokenizer: its config, the job file, the metrics of a long run
EXPORT_ROOM = 16 << 20


def export_bytes(parameters: int, *, model_dir=None) -> int:
    """What the output's export writes for ``parameters`` (float32; a LoRA run: its adapter's): the weights, the
    tokenizer files of ``model_dir`` and :data:`EXPORT_ROOM`. An earlier export at the path stays until the new
    one replaces it, so all of it is new."""
    from pathlib import Path

    from terastack.training.hf.sharded_writer import TOKENIZER_FILES

    files = [Path(model_dir) / f for f in TOKENIZER_FILES] if model_dir else []
    return parameters * 4 + sum(p.stat().st_size for p in files if p.is_file()) + EXPORT_ROOM


@dataclass(frozen=True, slots=True)
class JobModel:
    """The job's model as resolved: its name as the job gives it, its Hugging Face config (RoPE scaling
    applied) and its directory (None: a built-in architecture, randomly initialized)."""

    name: str
    hf_config: object
    model_dir: str | None

    @property
    def pretrained(self) -> bool:
        return self.model_dir is not None


def resolve_job_model(job) -> JobModel:
    """The model of ``job`` (``model.path``, default the built-in tiny-llama) with its RoPE scaling."""
    from terastack.training.hf.model_files import apply_rope_scaling
    from terastack.training.model_registry import DEFAULT_MODEL, resolve_model

    name = job.model.path or DEFAULT_MODEL
    hf_config, model_dir = resolve_model(name)
    if job.model.rope_scaling is not None:
        apply_rope_scaling(hf_config, *job.model.rope_scaling)
    return JobModel(name=name, hf_config=hf_config, model_dir=model_dir)


def job_lr(job, model: JobModel) -> float:
    """The peak learning rate of ``job``: its own, else the default for its model ([Note: default learning
    rates])."""
    if job.training.lr is not None:
        return job.training.lr
    return default_lr(pretrained=model.pretrained, lora=job.lora.rank is not None)


@dataclass(kw_only=True, slots=True)
class JobStart:
    """What the runner has made before the engine is built: what an :class:`EngineChoice` builds from."""

    job: object
    model: JobModel
    lr: float
    tokenizer: object
    data: object            # terastack.training.data.job_data.JobData
    steps_total: int
    schedule: object        # terastack.training.lr_schedule.LRSchedule
    #: the checkpoint to resume from (a terastack.training.checkpoint.Snapshot), its data already checked
    snapshot: object | None


class EngineChoice(Protocol):
    """An engine as the runner uses it (the engine itself satisfies
    :class:`~terastack.training.engine_protocol.TrainingEngine`)."""

    #: the command's words, for messages and finetune.yaml's header
    command: str

    def open(self, start: JobStart) -> AbstractContextManager:
        """Build the engine (resumed from ``start.snapshot`` when there is one) and print what only this engine
        says about itself; the context yields the engine and releases it on exit."""

    def result(self, start: JobStart, engine, done) -> dict:
        """The engine's own figures for the result (after the loop, the engine still open)."""


class JobRunner:
    """Runs ``job`` on the engine of ``choice`` ([Note: the job runner]). ``log``: the job's own lines;
    ``loop_log``: the loop's progress and validation lines (None: quiet); ``argv``: the command's words after
    ``terastack`` (for the resume command of an interrupted run)."""

    def __init__(self, job, choice: EngineChoice, *, log=sys.stderr, loop_log=sys.stderr,
                 argv: list[str] | None = None):
        self.job, self.choice, self.log, self.loop_log, self.argv = job, choice, log, loop_log, argv
        self.loop = self.engine = self.start = self.snapshot = None
        #: the ``--output`` directory (None: no export); refused up front when it may not be replaced
        self.output = None

    # ----------------------------------------------------------------- before the engine
    def prepare(self, model: JobModel | None = None) -> JobStart:
        """The model, the learning rate, the data, the step count and the schedule; the resumed checkpoint
        opened with its data checked."""
        from terastack.training.checkpoint import open_checkpoint
        from terastack.training.data.epochs import total_steps
        from terastack.training.data.job_data import JobData
        from terastack.training.data.stdlib_corpus import load_tokenizer
        from terastack.training.loop import DataSource, job_schedule

        from terastack.training.output_dir import OutputDir

        job, t = self.job, self.job.training
        model = model or resolve_job_model(job)
        self.check_writes(model)
        self.output = OutputDir(job.output.dir) if job.output.dir else None
        lr = job_lr(job, model)
        tokenizer = load_tokenizer(model.model_dir)  # None: byte tokens
        data = JobData(job, tokenizer, model.model_dir, seed=t.seed)
        steps = total_steps(steps=t.step_count, epochs=t.epochs, rows=data.rows, batch_size=t.batch_size,
                            grad_accum=t.grad_accum)
        if job.checkpoint.resume:
            self.snapshot = open_checkpoint(job.checkpoint.resume)  # the engine's parts, then the loop's, load
            self.snapshot.load({"data": DataSource(data.info)}, optional=["data"])  # other data: refused first
        self.start = JobStart(job=job, model=model, lr=lr, tokenizer=tokenizer, data=data, steps_total=steps,
                              schedule=job_schedule(job, lr=lr, total_steps=steps), snapshot=self.snapshot)
        return self.start

    def check_writes(self, model: JobModel) -> None:
        """[Note: what the job writes, checked first]
        Before any data is read or any engine built: the output is not, and does not hold, anything the job reads
        or keeps (it is replaced whole at the end: :func:`~terastack.training.output_dir.check_apart`), and every
        path the job writes (the settings made with ``setting(writes=True)``; the output's directory, where its
        export is made and renamed over it) can be written (:func:`terastack.disk_room.check_writable`). Once the
        engine is built and its parameters are known, the output's file system must hold the export
        (:meth:`check_room`). Each refusal is one line naming the path."""
        from terastack.disk_room import check_writable
        from terastack.training.output_dir import check_apart

        job = self.job
        if job.output.dir:
            others = {flag: path for flag, path in job.named_paths().items() if flag != "--output"}
            check_apart(job.output.dir, {**others, "--model": model.model_dir})
            check_writable(job.output.dir, what="--output", beside=True)
        for flag, path in job.named_paths(written=True).items():
            check_writable(path, what=flag)

    def check_room(self, start: JobStart, engine) -> None:
        """The output's file system holds the export ([Note: what the job writes, checked first])."""
        from terastack.disk_room import Need, check_room

        if self.output is None:
            return
        lora = self.job.lora.rank is not None
        params = engine.profile.trainable_params if lora else engine.profile.total_params
        check_room([Need("--output", str(self.output.path), export_bytes(params, model_dir=start.model.model_dir))])

    def resolved_job(self):
        """finetune.yaml: the job as run (its learning rate and seed spelled out, its files absolute, no resume),
        to be run again from the start."""
        absolute = self.job.with_absolute_paths()
        training = dataclasses.replace(absolute.training, lr=self.start.lr)
        return dataclasses.replace(absolute, training=training,
                                   checkpoint=dataclasses.replace(absolute.checkpoint, resume=None))

    # ----------------------------------------------------------------------------- the run
    def run(self, model: JobModel | None = None) -> dict:
        """The whole job ([Note: the job runner]); the result dictionary. Ctrl-C raises ``JobInterrupted``."""
        from terastack.memory import PeakRSS

        try:
            start = self.prepare(model)
            with PeakRSS() as rss:
                t_build = time.perf_counter()
                with self.choice.open(start) as engine:
                    self.engine = engine
                    setup_s = time.perf_counter() - t_build
                    self.check_room(start, engine)
                    self.check_vocabulary(start)
                    self.announce(start, engine)
                    done = self.train(start, engine)
                    self.export(start, engine)
                    result = {**self.figures(start, engine, done), "setup_s": setup_s,
                              **self.choice.result(start, engine, done)}
            result["peak_rss_bytes"] = rss.peak_bytes
            return result
        except KeyboardInterrupt:
            raise self.interrupted() from None

    def check_vocabulary(self, start: JobStart) -> None:
        vocab = getattr(start.model.hf_config, "vocab_size", None)
        if vocab is not None and start.data.max_token >= vocab:
            raise ValueError(f"the tokens of {start.data.info['source']} reach id {start.data.max_token} but "
                             f"{start.model.name} has a vocabulary of {vocab}")

    def announce(self, start: JobStart, engine) -> None:
        """The job's lines, after the engine's own: the resume, the data, the steps and the schedule."""
        from terastack.training.hf.model_files import check_seq_len

        t, log = self.job.training, self.log
        warning = check_seq_len(start.model.hf_config, t.seq_len)  # past the positions of a rotary model
        if warning:
            print(warning, file=log)
        if start.snapshot is not None:
            print(f"resumed from {self.job.checkpoint.resume} at step {engine.step_count}", file=log)
        if start.data.summary:
            print(start.data.summary, file=log)
        rows = start.data.rows
        print(f"{start.steps_total} steps of {t.grad_accum} x {t.batch_size} rows "
              f"({start.steps_total * t.grad_accum * t.batch_size / rows:.3g} epochs of {rows} rows); "
              f"lr {start.lr:g}, {t.lr_schedule} after {start.schedule.config.warmup_steps} warmup steps", file=log)
        if engine.step_count >= start.steps_total:
            print(f"checkpoint is at step {engine.step_count}, nothing to do for {start.steps_total} steps",
                  file=log)
        log.flush()

    def train(self, start: JobStart, engine):
        """The loop, with the metrics log and the output's ``DIR.partial/``."""
        from terastack.training.loop import FinetuneLoop, LoopConfig
        from terastack.training.metrics import MetricsLog

        job, output = self.job, self.output
        resume = job.checkpoint.resume
        if output is not None:
            output.start(resuming=bool(resume))
        with MetricsLog(self.metrics_path, resume_step=engine.step_count if resume else None) as metrics:
            self.loop = FinetuneLoop(engine, start.data.train, start.schedule,
                                     LoopConfig.from_job(job, total_steps=start.steps_total,
                                                         rows_per_epoch=start.data.rows),
                                     val_batches=start.data.val, metrics=metrics, log=self.loop_log,
                                     data_info=start.data.info, label=self.choice.command.removeprefix("terastack "))
            if start.snapshot is not None:
                self.loop.resume(start.snapshot, path=resume)
            return self.loop.run()

    @property
    def metrics_path(self):
        output = self.output
        return self.job.output.metrics or (output.metrics_path if output is not None else None)

    def export(self, start: JobStart, engine) -> None:
        from terastack.training.job import write_job_file

        output = self.output
        if output is None:
            return
        resolved = self.resolved_job()
        output.finish(engine, start.tokenizer, max_shard_size=self.job.output.max_shard_size,
                      write_job=lambda path: write_job_file(resolved, path, command=self.choice.command))
        print(f"exported to {output.path}", file=self.log, flush=True)

    def figures(self, start: JobStart, engine, done) -> dict:
        """The job's figures, whichever engine ran it."""
        from terastack.training.loop import perplexity

        job, t = self.job, self.job.training
        losses, evals = done.losses, done.evaluations
        hist = list(engine.history[-len(losses):]) if losses else []

        def per_step(name: str) -> float:
            return sum(getattr(h, name) for h in hist) / max(1, len(hist))

        output = self.output
        return {
            "model": start.model.name, "parameters": engine.profile.total_params,
            "trainable_parameters": engine.profile.trainable_params, "data": start.data.info,
            "steps": engine.step_count, "first_step": done.first_step, "total_steps": start.steps_total,
            "resumed_from": job.checkpoint.resume, "lr": start.lr,
            "epochs": engine.step_count * t.grad_accum * t.batch_size / start.data.rows,
            "losses": losses, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "grad_norms": [h.grad_norm for h in hist],
            "val_loss_first": evals[0][1] if evals else None, "val_loss_last": evals[-1][1] if evals else None,
            "val_ppl_last": perplexity(evals[-1][1]) if evals else None,
            "evaluations": [{"step": s, "val_loss": v} for s, v in evals], "val_rows": start.data.val_rows,
            # real tokens (padding left out) and those in the loss: terastack.training.metrics
            "tokens": done.tokens, "target_tokens": done.target_tokens,
            "tokens_per_s": done.tokens / done.train_seconds if losses else None,
            "step_s_mean": done.train_seconds / len(losses) if losses else None,
            "ssd_read_bytes_per_step": per_step("ssd_read_bytes"),
            "ssd_write_bytes_per_step": per_step("ssd_write_bytes"),
            "device_in_bytes_per_step": per_step("device_in_bytes"),
            "checkpoint": job.checkpoint.dir, "exported": job.output.dir,
            "metrics": (str(output.path / "metrics.jsonl") if output and not job.output.metrics
                        else job.output.metrics),
        }

    def interrupted(self) -> JobInterrupted:
        """Where the job stood when Ctrl-C came, as one line ([Note: an interrupted run])."""
        from terastack.training.loop import LastCheckpoint

        snapshot = self.snapshot
        if self.loop is not None:
            step, last = self.loop.state.step, self.loop.last_checkpoint
        else:
            step = (self.engine.step_count if self.engine is not None else
                    snapshot.step if snapshot is not None else None)
            last = LastCheckpoint(str(self.job.checkpoint.resume), snapshot.step) if snapshot is not None else None
        total = self.start.steps_total if self.start is not None else None
        line = interrupted_line(step=step, total=total, last=last, argv=self.argv,
                                checkpoint_dir=self.job.checkpoint.dir,
                                command=tuple(self.choice.command.split()[1:]))
        return JobInterrupted(line)


def summary_lines(result: dict) -> list[str]:
    """The closing lines of a job (loss, speed, traffic, validation)."""
    lines = []
    losses = result["losses"]
    if losses:
        lines.append(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps, "
                     f"{result['tokens_per_s']:.0f} tokens/s, {result['step_s_mean']:.3f} s/step; "
                     f"SSD {format_bytes(result['ssd_read_bytes_per_step'])} read + "
                     f"{format_bytes(result['ssd_write_bytes_per_step'])} written per step; "
                     f"peak RSS +{format_bytes(result['peak_rss_bytes'])}")
    measured, predicted = result.get("measured_step_s"), result.get("predicted_step_s")
    if measured and predicted:   # an engine that plans its step says how the plan did
        what = f"mean of {result['measured_steps']} steps after the first" if result["measured_steps"] > 1 \
            else "one step"
        lines.append(f"step {measured:.3f} s measured ({what}), {predicted:.3f} s predicted by the plan "
                     f"({measured / predicted - 1:+.0%})")
    evals = result["evaluations"]
    if evals:
        lines.append(f"validation loss {evals[0]['val_loss']:.4f} -> {evals[-1]['val_loss']:.4f} (perplexity "
                     f"{result['val_ppl_last']:.4g}) on {result['val_rows']} held-out rows")
    return lines
