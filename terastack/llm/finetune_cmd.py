"""``terastack finetune``: fine-tune a causal LM whose training state does not fit in memory.

With no arguments it trains the built-in ``tiny-llama`` on the running Python's standard-library sources
(byte tokens), with a host budget of a quarter of the model's training state so most of it lives on the SSD.
``--data`` takes a text file, a record file of instruction or chat data (JSONL, JSON, Parquet; the loss covers
completions / assistant turns: :mod:`terastack.training.data.examples`), or ``builtin:docstrings``.

This module maps the command line to a :class:`~terastack.training.job.JobConfig` and wires the pieces:
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
    # Job flags default to None: "not given", so that a --config file's value stands unless the flag is given
    # ([Note: job config resolution] in terastack.training.job).
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a YAML or TOML job file: any of the settings below by name (lr, epochs, grad_accum, "
                        "data, output...), flat or in sections, and a trainer: table of TrainerConfig fields. "
                        "Flags given on the command line win over the file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings that win over the file and the flags, e.g. lr=1e-5 epochs=2 "
                        "trainer.calibrate=false")
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default=None,
                   help="a Hugging Face model directory (safetensors), a config.json, or a built-in name "
                        "(default: tiny-llama, random init)")
    g.add_argument("--data", default=None,
                   help="a text file; a .jsonl/.json/.parquet file of text, prompt/completion, OpenAI messages, "
                        "ShareGPT conversations or Alpaca records; or builtin:docstrings (signature -> docstring "
                        "pairs from this Python's standard library). Default: this Python's standard-library sources")
    g.add_argument("--train-on-prompt", action="store_true", default=None,
                   help="with records: put prompts and user turns in the loss too (default: completions and "
                        "assistant turns only)")
    g.add_argument("--pack", action="store_true", default=None,
                   help="with records: pack several short examples into one row")
    g.add_argument("--val-data", default=None, metavar="FILE",
                   help="validation data, in the formats of --data (at most 64 rows are evaluated)")
    g.add_argument("--val-fraction", type=float, default=None,
                   help="the share of --data held out for validation (records: by a hash of the example, default "
                        "0.05; text: the end of the text, default 0)")
    g.add_argument("--seq-len", type=int, default=None, help="tokens per row (default 128)")
    t = p.add_argument_group("training")
    length = t.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, help="optimizer steps (default 20)")
    length.add_argument("--epochs", type=float, default=None,
                        help="passes over the training rows instead of --steps (each epoch in its own seeded order)")
    t.add_argument("--batch-size", type=int, default=None, help="rows per micro-batch (default 4)")
    t.add_argument("--grad-accum", type=int, default=None, metavar="N",
                   help="micro-batches per optimizer step (default 1); the loss is the mean over their target "
                        "tokens")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default 3e-4; 1e-5 for a checkpoint)")
    t.add_argument("--lr-schedule", default=None, choices=["constant", "linear", "cosine"],
                   help="after the warmup: constant, or a linear or cosine decay to --min-lr (default constant; "
                        "the formulas of transformers' get_*_schedule_with_warmup)")
    warmup = t.add_mutually_exclusive_group()
    warmup.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                        help="steps of linear warmup from 0 (default 0)")
    warmup.add_argument("--warmup-ratio", type=float, default=None, metavar="F",
                        help="warmup over this share of the steps (rounded up)")
    t.add_argument("--min-lr", type=float, default=None, help="the floor of the linear/cosine decay (default 0)")
    t.add_argument("--weight-decay", type=float, default=None)
    t.add_argument("--max-grad-norm", type=float, default=None,
                   help="global-norm gradient clipping (the metrics then carry grad_norm)")
    t.add_argument("--seed", type=int, default=None, help="initialization and data order (default 0)")
    t.add_argument("--lora", type=int, default=None, metavar="R", help="train a LoRA adapter of rank R (peft)")
    t.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="validation loss and perplexity every N steps (default: before training and at the end)")
    m = p.add_argument_group("memory and storage")
    m.add_argument("--device-budget", default=None, help="accelerator memory to use, e.g. 20GiB (default: auto)")
    m.add_argument("--host-budget", default=None,
                   help="host memory for training state and working sets, e.g. 64GiB (default: auto; the built-in "
                        "model gets a quarter of its training state)")
    m.add_argument("--memory-budget", default=None,
                   help="without a GPU: one budget for both tiers, split by the planner (instead of the two above)")
    m.add_argument("--store", default=None, help="directory on the SSD for the training state (default: temp dir)")
    m.add_argument("--activation-policy", default=None, choices=["auto", "keep", "host", "ssd", "recompute"])
    m.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16"])
    o = p.add_argument_group("output")
    o.add_argument("--output", "--save", dest="output", default=None, metavar="DIR",
                   help="the result: the trained model (save_pretrained format, a peft adapter with --lora) and its "
                        "tokenizer, metrics.jsonl and finetune.yaml (the resolved job: repeat it with --config). "
                        "Written under DIR.partial while training and renamed to DIR when complete")
    o.add_argument("--metrics", default=None, metavar="FILE",
                   help="per-step metrics as JSON lines (default: DIR/metrics.jsonl with --output); also "
                        "TensorBoard events beside it when the tensorboard package is installed")
    o.add_argument("--max-shard-size", default=None, metavar="SIZE",
                   help="split the exported weights into safetensors shards of at most SIZE with an index file, "
                        "as transformers does (default 5GB)")
    o.add_argument("--checkpoint", default=None, metavar="DIR", help="write checkpoints to DIR")
    o.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="checkpoint every N steps (default: only at the end when --checkpoint is given)")
    o.add_argument("--resume", default=None, metavar="DIR",
                   help="continue from the checkpoint in DIR: the schedule and the data order go on exactly")
    o.add_argument("--show-plan", action="store_true", help="print the placement plan before training")
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    o.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (open in Perfetto)")


def _trainer_config(job, *, builtin: bool, pretrained: bool, hf_config):
    """The job's TrainerConfig: its trainer table, then the job keys that are TrainerConfig fields."""
    from terastack.llm.trainer_config import LoraSpec, TrainerConfig

    fields = dict(job.trainer)
    fields.setdefault("lr", 1e-5 if pretrained else 3e-4)
    fields.update({"batch_size": job.batch_size, "seq_len": job.seq_len})
    for key, name in (("lr", "lr"), ("weight_decay", "weight_decay"), ("max_grad_norm", "max_grad_norm"),
                      ("device_budget", "device_budget"), ("host_budget", "host_budget"),
                      ("memory_budget", "memory_budget"), ("store", "store_dir"),
                      ("activation_policy", "activation_policy"), ("dtype", "dtype"), ("seed", "seed")):
        value = getattr(job, key)
        if value is not None:
            fields[name] = value
    fields["grad_accum"] = job.grad_accum
    if job.pack:
        fields["packed"] = True  # packed rows carry an attention mask per layer: the plan counts it
    if job.lora is not None:
        fields["lora"] = LoraSpec(r=job.lora, alpha=2 * job.lora)
    if builtin and "host_budget" not in fields and "memory_budget" not in fields:
        from terastack.training.hf.model_files import build_skeleton

        n = sum(p.numel() for p in build_skeleton(hf_config).parameters())
        fields["host_budget"] = max(4 << 20, n * 16 // 4)  # a quarter of the training state: most of it on SSD
    if isinstance(fields.get("lora"), dict):
        fields["lora"] = LoraSpec(**fields["lora"])
    return TrainerConfig.from_dict(fields)


def run(args: argparse.Namespace) -> int:
    from terastack import trace
    from terastack.training.model_registry import DEFAULT_MODEL, resolve_model
    from terastack.training.data.stdlib_corpus import load_tokenizer
    from terastack.training.data.epochs import total_steps
    from terastack.training.loop import FinetuneLoop, LoopConfig, perplexity
    from terastack.training.job import JOB_KEYS, resolve_job, write_job_file
    from terastack.training.data.job_data import JobData
    from terastack.training.output_dir import OutputDir
    from terastack.training.lr_schedule import LRSchedule, warmup_from_ratio
    from terastack.training.metrics import MetricsLog
    from terastack.llm.trainer import Trainer
    from terastack.memory import PeakRSS

    job = resolve_job(file=args.config, flags={k: getattr(args, k) for k in JOB_KEYS if hasattr(args, k)},
                      overrides=args.overrides or [])
    spec = job.model or DEFAULT_MODEL
    hf_config, model_dir = resolve_model(spec)
    config = _trainer_config(job, builtin=job.model is None, pretrained=model_dir is not None, hf_config=hf_config)
    output = OutputDir(job.output) if job.output else None
    scratch = None
    if job.store is None and "store_dir" not in job.trainer:
        scratch = tempfile.mkdtemp(prefix="terastack-finetune-")
        config = dataclasses.replace(config, store_dir=scratch)
    tokenizer = load_tokenizer(model_dir)  # None: byte tokens
    data = JobData(job, tokenizer, model_dir, seed=config.seed)
    steps_total = total_steps(steps=job.step_count, epochs=job.epochs, rows=data.rows, batch_size=job.batch_size,
                              grad_accum=job.grad_accum)
    warmup = job.warmup_steps if job.warmup_steps is not None else warmup_from_ratio(job.warmup_ratio or 0.0,
                                                                                     steps_total)
    schedule = LRSchedule(LRSchedule.Config(kind=job.lr_schedule, lr=config.lr, total_steps=steps_total,
                                            warmup_steps=warmup, min_lr=job.min_lr))
    resolved = dataclasses.replace(job, lr=config.lr, seed=config.seed, resume=None)
    if args.trace:
        trace.tracer.start()
    log = sys.stderr
    try:
        with PeakRSS() as rss:
            t_build = time.perf_counter()
            if job.resume:
                trainer = Trainer.load_checkpoint(job.resume, config, expect_model=hf_config)
                saved_data = trainer.resumed_extra.get("data", {})
                if saved_data.get("sha256") not in (None, data.info["sha256"]):
                    trainer.close()
                    raise ValueError(f"--resume {job.resume}: the checkpoint was trained on other data "
                                     f"({saved_data.get('source')}); give the same --data")
            elif model_dir is not None:
                trainer = Trainer.from_pretrained(model_dir, config)
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
                if args.show_plan:
                    print(trainer.describe_plan(), file=log)
                else:
                    p = trainer.plan.prediction
                    print(f"plan: {p.bottleneck}-bound, predicted {p.step_s:.3f} s/step "
                          f"({p.tokens_per_s:.0f} tokens/s); --show-plan for the placement", file=log)
                if data.summary:
                    print(data.summary, file=log)
                print(f"{steps_total} steps of {job.grad_accum} x {job.batch_size} rows "
                      f"({steps_total * job.grad_accum * job.batch_size / data.rows:.3g} epochs of {data.rows} "
                      f"rows); lr {config.lr:g}, {job.lr_schedule} after {warmup} warmup steps", file=log)
                if trainer.step_count >= steps_total:
                    print(f"checkpoint is at step {trainer.step_count}, nothing to do for {steps_total} steps",
                          file=log)
                if output is not None:
                    output.start(resuming=bool(job.resume))
                metrics_path = job.metrics or (output.metrics_path if output is not None else None)
                with MetricsLog(metrics_path, resume_step=trainer.step_count if job.resume else None) as metrics:
                    loop = FinetuneLoop(
                        trainer, data.train, schedule,
                        LoopConfig(total_steps=steps_total, batch_size=job.batch_size, grad_accum=job.grad_accum,
                                   rows_per_epoch=data.rows, eval_every=job.eval_every,
                                   checkpoint_dir=job.checkpoint, checkpoint_every=job.checkpoint_every),
                        val_batches=data.val, metrics=metrics, log=log, checkpoint_extra={"data": data.info})
                    done = loop.run()
                if output is not None:
                    output.finish(trainer, tokenizer, max_shard_size=job.max_shard_size,
                                  write_job=lambda path: write_job_file(resolved, path))
                    print(f"exported to {output.path}", file=log)
                losses = done.losses
                hist = trainer.history[-len(losses):] if losses else []
                tokens_done = sum(h.tokens for h in hist)
                evals = done.evaluations
                result = {
                    "model": spec, "parameters": trainer.profile.total_params,
                    "trainable_parameters": trainer.profile.trainable_params, "data": data.info,
                    "steps": trainer.step_count, "first_step": done.first_step, "total_steps": steps_total,
                    "epochs": trainer.step_count * job.grad_accum * job.batch_size / data.rows,
                    "losses": losses, "loss_first": losses[0] if losses else None,
                    "loss_last": losses[-1] if losses else None,
                    "val_loss_first": evals[0][1] if evals else None, "val_loss_last": evals[-1][1] if evals else None,
                    "val_ppl_last": perplexity(evals[-1][1]) if evals else None,
                    "evaluations": [{"step": s, "val_loss": v} for s, v in evals],
                    "tokens_per_s": tokens_done / done.train_seconds if losses else None,
                    "step_s_mean": done.train_seconds / len(losses) if losses else None, "setup_s": build_s,
                    "ssd_read_bytes_per_step": sum(h.ssd_read_bytes for h in hist) / max(1, len(hist)),
                    "ssd_write_bytes_per_step": sum(h.ssd_write_bytes for h in hist) / max(1, len(hist)),
                    "device_in_bytes_per_step": sum(h.device_in_bytes for h in hist) / max(1, len(hist)),
                    "plan": trainer.plan.summary(), "usage": trainer.usage(),
                    "checkpoint": job.checkpoint, "exported": job.output,
                    "metrics": str(output.path / "metrics.jsonl") if output and not job.metrics else job.metrics,
                }
        result["peak_rss_bytes"] = rss.peak_bytes
    finally:
        if args.trace:
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
