"""``terastack finetune``: fine-tune a causal LM whose training state does not fit in memory.

With no arguments it trains the built-in ``tiny-llama`` on the running Python's standard-library sources
(byte tokens), with a host budget of a quarter of the model's training state so most of it lives on the SSD.
``--data`` takes a text file, a record file of instruction or chat data (JSONL, JSON, Parquet; the loss covers
completions / assistant turns: :mod:`terastack.llm.supervised`), or ``builtin:docstrings``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

from terastack.units import format_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="a Hugging Face model directory (safetensors), a config.json, or a built-in name "
                        "(default: tiny-llama, random init)")
    p.add_argument("--data", default=None,
                   help="a text file; a .jsonl/.json/.parquet file of text, prompt/completion, OpenAI messages, "
                        "ShareGPT conversations or Alpaca records; or builtin:docstrings (signature -> docstring "
                        "pairs from this Python's standard library). Default: this Python's standard-library sources")
    p.add_argument("--train-on-prompt", action="store_true",
                   help="with records: put prompts and user turns in the loss too (default: completions and "
                        "assistant turns only)")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="with records: the share held out for a validation loss before and after training "
                        "(default 0.05; 0: none)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 3e-4; 1e-5 for a checkpoint)")
    p.add_argument("--weight-decay", type=float, default=None)
    p.add_argument("--max-grad-norm", type=float, default=None, help="global-norm gradient clipping")
    p.add_argument("--device-budget", default=None, help="accelerator memory to use, e.g. 20GiB (default: auto)")
    p.add_argument("--host-budget", default=None,
                   help="host memory for training state and working sets, e.g. 64GiB (default: auto; the built-in "
                        "model gets a quarter of its training state)")
    p.add_argument("--memory-budget", default=None,
                   help="without a GPU: one budget for both tiers, split by the planner (instead of the two above)")
    p.add_argument("--store", default=None, help="directory on the SSD for the training state (default: temp dir)")
    p.add_argument("--activation-policy", default=None, choices=["auto", "keep", "host", "ssd", "recompute"])
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16"])
    p.add_argument("--lora", type=int, default=None, metavar="R", help="train a LoRA adapter of rank R (peft)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--config", default=None, help="a TOML file of TrainerConfig fields ([trainer] table)")
    p.add_argument("--resume", default=None, metavar="DIR", help="continue from the checkpoint in DIR")
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="write checkpoints to DIR")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="checkpoint every N steps "
                   "(default: only at the end when --checkpoint is given)")
    p.add_argument("--save", default=None, metavar="DIR", help="export the trained model to DIR "
                   "(save_pretrained format: config.json, model.safetensors and the model's tokenizer; a peft "
                   "adapter with --lora)")
    p.add_argument("--show-plan", action="store_true", help="print the placement plan before training")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (open in Perfetto)")


def _config(args, *, builtin: bool, pretrained: bool, hf_config):
    from terastack.llm.config import LoraSpec, TrainerConfig

    base = TrainerConfig.from_toml(args.config).to_dict() if args.config else {}
    fields = dict(base)
    fields.setdefault("lr", 1e-5 if pretrained else 3e-4)
    fields.update({"batch_size": args.batch_size, "seq_len": args.seq_len})
    for flag, field in (("lr", "lr"), ("weight_decay", "weight_decay"), ("max_grad_norm", "max_grad_norm"),
                        ("device_budget", "device_budget"), ("host_budget", "host_budget"),
                        ("memory_budget", "memory_budget"), ("store", "store_dir"),
                        ("activation_policy", "activation_policy"), ("dtype", "dtype"), ("seed", "seed")):
        value = getattr(args, flag)
        if value is not None:
            fields[field] = value
    if args.lora is not None:
        fields["lora"] = LoraSpec(r=args.lora, alpha=2 * args.lora)
    if builtin and args.host_budget is None and "host_budget" not in base and args.memory_budget is None:
        from terastack.llm.model import build_skeleton

        n = sum(p.numel() for p in build_skeleton(hf_config).parameters())
        fields["host_budget"] = max(4 << 20, n * 16 // 4)  # a quarter of the training state: most of it on SSD
    if isinstance(fields.get("lora"), dict):
        fields["lora"] = LoraSpec(**fields["lora"])
    return TrainerConfig.from_dict(fields)


def run(args: argparse.Namespace) -> int:
    from terastack import trace
    from terastack.llm.builtin import DEFAULT_MODEL, resolve_model
    from terastack.llm.data import TokenBatches, load_tokenizer, load_tokens
    from terastack.llm.data_files import is_record_file
    from terastack.llm.supervised import SupervisedData, validation_loss
    from terastack.llm.trainer import Trainer
    from terastack.memory import PeakRSS
    from terastack.progress import Progress

    if args.steps < 1:
        raise ValueError(f"--steps: must be >= 1, got {args.steps}")
    spec = args.model or DEFAULT_MODEL
    hf_config, model_dir = resolve_model(spec)
    config = _config(args, builtin=args.model is None, pretrained=model_dir is not None, hf_config=hf_config)
    scratch = None
    if args.store is None and "store_dir" not in (vars(args) or {}):
        scratch = tempfile.mkdtemp(prefix="terastack-finetune-")
        import dataclasses

        config = dataclasses.replace(config, store_dir=scratch)
    tokenizer = load_tokenizer(model_dir)  # None: byte tokens
    records = args.data is not None and (args.data.startswith("builtin:") or is_record_file(args.data))
    if records:
        data = SupervisedData.load(args.data, tokenizer, SupervisedData.Config(
            seq_len=args.seq_len, train_on_prompt=args.train_on_prompt, val_fraction=args.val_fraction))
        data_info, max_token = data.info(), data.max_token_id
    else:
        if args.train_on_prompt:
            raise ValueError("--train-on-prompt: only for record files and builtin: data sets (plain text has no "
                             "prompts)")
        tokens, data_info = load_tokens(args.data, model_dir)
        max_token = int(tokens.max())
    if args.trace:
        trace.tracer.start()
    log = sys.stderr
    try:
        with PeakRSS() as rss:
            t_build = time.perf_counter()
            if args.resume:
                trainer = Trainer.load_checkpoint(args.resume, config, expect_model=hf_config)
                saved_data = trainer.resumed_extra.get("data", {})
                if saved_data.get("sha256") not in (None, data_info["sha256"]):
                    raise ValueError(f"--resume {args.resume}: the checkpoint was trained on other data "
                                     f"({saved_data.get('source')}); give the same --data")
            elif model_dir is not None:
                trainer = Trainer.from_pretrained(model_dir, config)
            else:
                trainer = Trainer.from_config(hf_config, config, name=spec)
            with trainer:
                vocab = getattr(hf_config, "vocab_size", None)
                if vocab is not None and max_token >= vocab:
                    raise ValueError(f"the tokens of {data_info['source']} reach id {max_token} but "
                                     f"{spec} has a vocabulary of {vocab}")
                if records:
                    batches = data.batches(args.batch_size, seed=config.seed)
                    val_batches = data.val_batches(args.batch_size)
                else:
                    batches = TokenBatches(tokens, seq_len=args.seq_len, batch_size=args.batch_size,
                                           seed=config.seed)
                    val_batches = []
                build_s = time.perf_counter() - t_build
                state = trainer.profile.state_bytes() + trainer.profile.trainable_params * 4
                print(f"terastack finetune: {spec} ({trainer.profile.total_params / 1e6:.1f}M parameters, "
                      f"training state {format_bytes(state)}) on {data_info['source']}; "
                      f"device budget {format_bytes(trainer.plan.device_budget)}, host budget "
                      f"{format_bytes(trainer.plan.host_budget)}; store {trainer.run_dir}", file=log)
                if args.show_plan:
                    print(trainer.describe_plan(), file=log)
                else:
                    p = trainer.plan.prediction
                    print(f"plan: {p.bottleneck}-bound, predicted {p.step_s:.3f} s/step "
                          f"({p.tokens_per_s:.0f} tokens/s); --show-plan for the placement", file=log)
                if records:
                    print(data.summary(), file=log)
                val_first = validation_loss(trainer, val_batches) if val_batches else None
                if val_first is not None:
                    print(f"validation loss before training: {val_first:.4f}", file=log)
                start = trainer.step_count
                if start >= args.steps:
                    print(f"checkpoint is at step {start}, nothing to do for --steps {args.steps}", file=log)
                progress = Progress(args.steps - start, label="finetune", unit="step", stream=log, log_every=5.0)
                losses = []
                t0 = time.perf_counter()
                for step in range(start, args.steps):
                    loss = trainer.step(**batches.step_inputs(step))
                    losses.append(loss)
                    h = trainer.history[-1]
                    progress.update(1, loss=loss, **{"tok/s": h.tokens / h.seconds,
                                                     "ssd r MB/s": h.ssd_read_bytes / h.seconds / 1e6,
                                                     "ssd w MB/s": h.ssd_write_bytes / h.seconds / 1e6,
                                                     "to device MB/s": h.device_in_bytes / h.seconds / 1e6})
                    if args.checkpoint and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
                        trainer.save_checkpoint(args.checkpoint, extra={"data": data_info})
                progress.close()
                trainer.synchronize()
                train_s = time.perf_counter() - t0
                val_last = validation_loss(trainer, val_batches) if val_batches else None
                if args.checkpoint and (not args.checkpoint_every or args.steps % args.checkpoint_every):
                    trainer.save_checkpoint(args.checkpoint, extra={"data": data_info})
                if args.save:
                    trainer.save_pretrained(args.save)
                    if tokenizer is not None:  # the export loads with transformers on its own, tokenizer too
                        tokenizer.save_pretrained(args.save)
                    print(f"exported to {args.save}", file=log)
                hist = trainer.history[-len(losses):] if losses else []
                tokens_done = sum(h.tokens for h in hist)
                result = {
                    "model": spec, "parameters": trainer.profile.total_params,
                    "trainable_parameters": trainer.profile.trainable_params, "data": data_info,
                    "steps": trainer.step_count, "first_step": start, "losses": losses,
                    "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
                    "val_loss_first": val_first, "val_loss_last": val_last,
                    "tokens_per_s": tokens_done / train_s if losses else None,
                    "step_s_mean": train_s / len(losses) if losses else None, "setup_s": build_s,
                    "ssd_read_bytes_per_step": sum(h.ssd_read_bytes for h in hist) / max(1, len(hist)),
                    "ssd_write_bytes_per_step": sum(h.ssd_write_bytes for h in hist) / max(1, len(hist)),
                    "device_in_bytes_per_step": sum(h.device_in_bytes for h in hist) / max(1, len(hist)),
                    "plan": trainer.plan.summary(), "usage": trainer.usage(),
                    "checkpoint": args.checkpoint, "exported": args.save,
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
        if val_first is not None:
            print(f"validation loss {val_first:.4f} -> {val_last:.4f} on {len(data.val)} held-out examples")
    return 0
