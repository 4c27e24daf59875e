"""``terastack finetune``: fine-tune a causal LM whose training state does not fit in memory.

With no arguments it trains the built-in ``tiny-llama`` on the running Python's standard-library sources
(byte tokens), with a host budget of a quarter of the model's training state so most of it lives on the SSD.
``--data`` takes a text file, a record file of instruction or chat data (JSONL, JSON, Parquet; the loss covers
completions / assistant turns: :mod:`terastack.training.data.examples`), or ``builtin:docstrings``.

This module reads the job (:mod:`terastack.training.job`: file, flags, overrides), builds the trainer's settings
from it (:meth:`~terastack.llm.trainer_config.TrainerConfig.from_job`) and wires the pieces:
the data (:mod:`terastack.training.data.job_data`), the trainer, the schedule
(:mod:`terastack.training.lr_schedule`), the loop (:mod:`terastack.training.loop`), the metrics
(:mod:`terastack.training.metrics`) and the output directory (:mod:`terastack.training.output_dir`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time

from terastack.units import format_bytes

def add_arguments(p: argparse.ArgumentParser) -> None:
    # One flag per job setting, derived from the job's sections (terastack.training.job); each defaults to None,
    # "not given", so that a --config file's value stands unless the flag is given.
    from terastack.training.job import add_job_arguments

    p.add_argument("--config", default=None, metavar="FILE",
                   help="a YAML or TOML job file: sections of settings (training: {lr: 1e-5, epochs: 2}) or the "
                        "flags' names at the top level (lr: 1e-5); files with a trainer: table still read. Flags "
                        "given on the command line win over the file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings that win over the file and the flags, e.g. lr=1e-5 training.epochs=2 "
                        "offload.calibrate=false")
    add_job_arguments(p, skip=("disdp",))
    o = p.add_argument_group("this run")
    o.add_argument("--show-plan", action="store_true", help="print the placement plan before training")
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    o.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (open in Perfetto)")


#: the peak learning rate when the job gives none ([Note: default learning rates])
LR_FROM_SCRATCH, LR_PRETRAINED, LR_LORA = 3e-4, 1e-5, 1e-4


def default_lr(*, pretrained: bool, lora: bool) -> float:
    """[Note: default learning rates]
    A model trained from a random initialization takes 3e-4; fine-tuning all weights of a pretrained model
    1e-5; a LoRA adapter 1e-4 (its weights start at zero and are few: the rate peft's examples and the common
    fine-tuners use, 1e-4 to 2e-4, whatever the base)."""
    return LR_LORA if lora else LR_PRETRAINED if pretrained else LR_FROM_SCRATCH


def _trainer_config(job, *, builtin: bool, pretrained: bool, hf_config, store_dir: str | None):
    """The job's TrainerConfig: the job's settings, and what this command decides where the job leaves them
    unset (the learning rate by whether the model is pretrained or a LoRA adapter trains; the built-in model's
    host budget; a scratch store)."""
    from terastack.llm.trainer_config import TrainerConfig

    given = {}
    if job.training.lr is None:
        given["lr"] = default_lr(pretrained=pretrained, lora=job.lora.rank is not None)
    if builtin and job.store.host_budget is None and job.store.memory_budget is None:
        from terastack.training.hf.model_files import build_skeleton

        n = sum(p.numel() for p in build_skeleton(hf_config).parameters())
        given["host_budget"] = max(4 << 20, n * 16 // 4)  # a quarter of the training state: most of it on SSD
    if store_dir is not None:
        given["store_dir"] = store_dir
    return TrainerConfig.from_job(job, **given)


def resume_command(argv: list[str] | None, checkpoint: str) -> str:
    """The command line that continues this run from ``checkpoint``: the same words (``argv``: the words after
    ``terastack``), any ``--resume`` among them replaced."""
    import shlex

    words, skip = [], False
    for word in argv or ["finetune"]:
        if skip:
            skip = False
        elif word == "--resume":
            skip = True
        elif not (word.startswith("--resume=") or word.split("=", 1)[0] in ("resume", "checkpoint.resume")):
            words.append(word)
    return shlex.join(["terastack", *words, "--resume", checkpoint])


def interrupted_line(*, step: int | None, total: int | None, last, argv: list[str] | None,
                     checkpoint_dir: str | None = None) -> str:
    """[Note: an interrupted run]
    Ctrl-C anywhere in ``terastack finetune`` ends it with exit status 130 and one line: the step reached, the
    newest checkpoint of the job (``last``: a loop's ``LastCheckpoint``, the resumed one until this run writes
    one; None: none) and the exact command that resumes from it -- or that there is none to resume from. The
    optimizer's updates let a KeyboardInterrupt through as itself (terastack.llm.engine.schedules)."""
    where = "before training started" if step is None else f"at step {step}" + (f" of {total}" if total else "")
    if last is None:
        how = (f"none was written to {checkpoint_dir} yet" if checkpoint_dir else
               "--checkpoint DIR --checkpoint-every N keeps one")
        return f"interrupted {where}; no checkpoint to resume from ({how})"
    return (f"interrupted {where}; last checkpoint {last.path} (step {last.step}); resume with: "
            f"{resume_command(argv, last.path)}")


def run(args: argparse.Namespace) -> int:
    from terastack import trace
    from terastack.training.model_registry import DEFAULT_MODEL, resolve_model
    from terastack.training.data.stdlib_corpus import load_tokenizer
    from terastack.training.data.epochs import total_steps
    from terastack.training.loop import DataSource, FinetuneLoop, LastCheckpoint, LoopConfig, job_schedule, perplexity
    from terastack.training.job import job_flags, resolve_job, write_job_file
    from terastack.training.data.job_data import JobData
    from terastack.training.hf.model_files import apply_rope_scaling, check_seq_len
    from terastack.training.output_dir import OutputDir
    from terastack.training.metrics import MetricsLog
    from terastack.llm.trainer import Trainer
    from terastack.memory import PeakRSS

    job = resolve_job(file=args.config, flags=job_flags(args), overrides=args.overrides or [])
    # finetune.yaml names every file absolute, so that it runs the same from any directory
    absolute = job.with_absolute_paths()
    t = job.training
    spec = job.model.path or DEFAULT_MODEL
    log = sys.stderr
    argv = getattr(args, "_argv", None)
    scratch, tracing = None, False
    loop = trainer = snapshot = steps_total = None
    try:
        hf_config, model_dir = resolve_model(spec)
        if job.model.rope_scaling is not None:
            apply_rope_scaling(hf_config, *job.model.rope_scaling)
        if job.store.dirs is None:
            scratch = tempfile.mkdtemp(prefix="terastack-finetune-")
        config = _trainer_config(job, builtin=job.model.path is None, pretrained=model_dir is not None,
                                 hf_config=hf_config, store_dir=scratch)
        output = OutputDir(job.output.dir) if job.output.dir else None
        tokenizer = load_tokenizer(model_dir)  # None: byte tokens
        data = JobData(job, tokenizer, model_dir, seed=config.seed)
        steps_total = total_steps(steps=t.step_count, epochs=t.epochs, rows=data.rows, batch_size=t.batch_size,
                                  grad_accum=t.grad_accum)
        schedule = job_schedule(job, lr=config.lr, total_steps=steps_total)
        warmup = schedule.config.warmup_steps
        # finetune.yaml: the job as run (its learning rate and seed spelled out), to be run again from the start
        resolved = dataclasses.replace(absolute, training=dataclasses.replace(absolute.training, lr=config.lr,
                                                                              seed=config.seed),
                                       checkpoint=dataclasses.replace(absolute.checkpoint, resume=None))
        resume = job.checkpoint.resume
        if args.trace:
            trace.tracer.start()
            tracing = True
        with PeakRSS() as rss:
            t_build = time.perf_counter()
            if resume:
                from terastack.llm.engine_state import open_checkpoint

                snapshot = open_checkpoint(resume)  # the trainer's parts, then the loop's, load from it
                snapshot.load({"data": DataSource(data.info)}, optional=["data"])  # other data: refused first
                trainer = Trainer.load_checkpoint(snapshot, config, expect_model=hf_config)
            elif model_dir is not None:
                trainer = Trainer.from_pretrained(model_dir, config, hf_config=hf_config)
            else:
                trainer = Trainer.from_config(hf_config, config, name=spec)
            with trainer:
                vocab = getattr(hf_config, "vocab_size", None)
                if vocab is not None and data.max_token >= vocab:
                    raise ValueError(f"the tokens of {data.info['source']} reach id {data.max_token} but "
                                     f"{spec} has a vocabulary of {vocab}")
                build_s = time.perf_counter() - t_build
                state = trainer.profile.state_bytes() + trainer.profile.trainable_params * 4
                print(f"terastack finetune: {spec} ({trainer.profile.total_params / 1e6:.1f}M parameters, "
                      f"training state {format_bytes(state)}) on {data.info['source']}; "
                      f"device budget {format_bytes(trainer.plan.device_budget)}, host budget "
                      f"{format_bytes(trainer.plan.host_budget)}; store {trainer.run_dir}", file=log)
                warning = check_seq_len(trainer.hf_config, t.seq_len)  # past the positions of a rotary model
                if warning:
                    print(warning, file=log)
                if snapshot is not None:
                    print(f"resumed from {resume} at step {trainer.step_count}", file=log)
                if args.show_plan:
                    print(trainer.describe_plan(), file=log)
                else:
                    p = trainer.plan.prediction
                    print(f"plan: {p.bottleneck}-bound, predicted {p.step_s:.3f} s/step "
                          f"({p.tokens_per_s:.0f} tokens/s); --show-plan for the placement", file=log)
                if data.summary:
                    print(data.summary, file=log)
                print(f"{steps_total} steps of {t.grad_accum} x {t.batch_size} rows "
                      f"({steps_total * t.grad_accum * t.batch_size / data.rows:.3g} epochs of {data.rows} "
                      f"rows); lr {config.lr:g}, {t.lr_schedule} after {warmup} warmup steps", file=log)
                if trainer.step_count >= steps_total:
                    print(f"checkpoint is at step {trainer.step_count}, nothing to do for {steps_total} steps",
                          file=log)
                if output is not None:
                    output.start(resuming=bool(resume))
                metrics_path = job.output.metrics or (output.metrics_path if output is not None else None)
                with MetricsLog(metrics_path, resume_step=trainer.step_count if resume else None) as metrics:
                    loop = FinetuneLoop(
                        trainer, data.train, schedule,
                        LoopConfig.from_job(job, total_steps=steps_total, rows_per_epoch=data.rows),
                        val_batches=data.val, metrics=metrics, log=log, data_info=data.info)
                    if snapshot is not None:
                        loop.resume(snapshot, path=resume)
                    done = loop.run()
                if output is not None:
                    output.finish(trainer, tokenizer, max_shard_size=job.output.max_shard_size,
                                  write_job=lambda path: write_job_file(resolved, path))
                    print(f"exported to {output.path}", file=log)
                losses = done.losses
                hist = trainer.history[-len(losses):] if losses else []
                evals = done.evaluations
                result = {
                    "model": spec, "parameters": trainer.profile.total_params,
                    "trainable_parameters": trainer.profile.trainable_params, "data": data.info,
                    "steps": trainer.step_count, "first_step": done.first_step, "total_steps": steps_total,
                    "resumed_from": resume,
                    "epochs": trainer.step_count * t.grad_accum * t.batch_size / data.rows,
                    "losses": losses, "loss_first": losses[0] if losses else None,
                    "loss_last": losses[-1] if losses else None,
                    "val_loss_first": evals[0][1] if evals else None, "val_loss_last": evals[-1][1] if evals else None,
                    "val_ppl_last": perplexity(evals[-1][1]) if evals else None,
                    "evaluations": [{"step": s, "val_loss": v} for s, v in evals],
                    # real tokens (padding left out) and those in the loss: terastack.training.metrics
                    "tokens": done.tokens, "target_tokens": done.target_tokens,
                    "tokens_per_s": done.tokens / done.train_seconds if losses else None,
                    "step_s_mean": done.train_seconds / len(losses) if losses else None, "setup_s": build_s,
                    "ssd_read_bytes_per_step": sum(h.ssd_read_bytes for h in hist) / max(1, len(hist)),
                    "ssd_write_bytes_per_step": sum(h.ssd_write_bytes for h in hist) / max(1, len(hist)),
                    "device_in_bytes_per_step": sum(h.device_in_bytes for h in hist) / max(1, len(hist)),
                    "plan": trainer.plan.summary(), "usage": trainer.usage(),
                    "checkpoint": job.checkpoint.dir, "exported": job.output.dir,
                    "metrics": (str(output.path / "metrics.jsonl") if output and not job.output.metrics
                                else job.output.metrics),
                }
        result["peak_rss_bytes"] = rss.peak_bytes
    except KeyboardInterrupt:
        # [Note: an interrupted run]: where the run stood and how to go on, in one line; exit status 130
        if loop is not None:
            step, last = loop.state.step, loop.last_checkpoint
        else:
            step = trainer.step_count if trainer is not None else snapshot.step if snapshot is not None else None
            last = LastCheckpoint(str(resume), snapshot.step) if snapshot is not None else None
        print(interrupted_line(step=step, total=steps_total, last=last, argv=argv,
                               checkpoint_dir=job.checkpoint.dir), file=log)
        return 130
    finally:
        if tracing:
            trace.tracer.stop()
            print(f"trace written to {trace.tracer.save(args.trace)}", file=log)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        if losses:
            print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps, "
                  f"{result['tokens_per_s']:.0f} tokens/s, {result['step_s_mean']:.3f} s/step; "
                  f"SSD {format_bytes(result['ssd_read_bytes_per_step'])} read + "
                  f"{format_bytes(result['ssd_write_bytes_per_step'])} written per step; "
                  f"peak RSS +{format_bytes(result['peak_rss_bytes'])}")
        if evals:
            print(f"validation loss {evals[0][1]:.4f} -> {evals[-1][1]:.4f} (perplexity "
                  f"{result['val_ppl_last']:.4g}) on {data.val_rows} held-out rows")
    return 0
