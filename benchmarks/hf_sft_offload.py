"""A TRL SFTTrainer script through ``terastack.hf.offload`` against ``terastack finetune``, on the same rows, sequence
length and memory budget: each one's peak RSS and step time, and their ratio.

    python benchmarks/hf_sft_offload.py --size 1.1b --dir /nvme/bench --budget 2560MiB --steps 6 --rss-limit 12GiB --json

Both contenders train the TinyLlama-shape 1.1B model (``llama-1.1b``: a directory holding its config alone, so
each writes a random initialization straight to its store, seeded alike; nothing downloads), float32 on the CPU,
AdamW (torch's fused kernel, as finetune's auto picks on a CPU), global-norm clipping at 1.0, gradient
accumulation, the planner's own activation policy, the same memory budget and store directory, on the rows
``terastack finetune`` cuts from one text file (byte tokens): the SFT script's dataset is those very rows.
Targets (the issue's): the SFT process's peak RSS <= 4 GiB, its step <= 1.1x finetune's.

Each contender runs in a child process under an RSS watchdog (terastack.bench_watchdog) set by ``--rss-limit``:
a new interpreter (``--fork``: a fork of this one, its imports done, which the smoke test uses), whose peak
resident set is its own ``VmHWM``. A step's time is the time between two optimizer steps' ends (the SFT
script's: a Trainer callback; finetune's: its metrics' per-step seconds, which leave its loop's own time out, so
the ratio errs against the SFT script); the first ``--warmup`` steps are left out and the median is kept.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: --size -> the built-in model it trains
SIZES = {"1.1b": "llama-1.1b", "150m": "llama-150m", "tiny": "tiny-llama"}
CONTENDERS = ("finetune", "sft")
LR = 1e-4


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="1.1b")
    p.add_argument("--dir", required=True, help="a directory on the SSD: the model config, the data, the stores")
    p.add_argument("--budget", default="2560MiB", help="each contender's memory_budget (default 2560MiB: the "
                   "process holds about 1 GiB more, its libraries and working memory)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median (default 2)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--rss-limit", default="12GiB", help="the watchdog's limit on each contender (default 12GiB)")
    p.add_argument("--hardware", help="a probe JSON to plan for (default: this machine's probe)")
    p.add_argument("--no-calibrate", action="store_true", help="plan from the probe alone, without timing each "
                   "distinct layer first (both contenders; the smoke test)")
    p.add_argument("--fork", action="store_true", help="children are forks of this process (the smoke test)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ set-up
def prepare(args) -> tuple[Path, Path]:
    """The model directory (its config alone) and the text file both contenders train on."""
    import numpy as np

    from terastack.training.model_registry import hf_config

    root = Path(args.dir)
    model_dir, data = root / "model", root / "data.txt"
    model_dir.mkdir(parents=True, exist_ok=True)
    hf_config(SIZES[args.size]).save_pretrained(str(model_dir))
    rows = (args.steps + 1) * args.grad_accum * args.batch
    rng = np.random.default_rng(0)
    words = ["".join(chr(c) for c in rng.integers(97, 123, rng.integers(2, 9))) for _ in range(4096)]
    text, size = [], 0
    while size < rows * args.seq_len + 1:
        word = words[int(rng.integers(len(words)))]
        text.append(word)
        size += len(word) + 1
    data.write_text(" ".join(text))
    return model_dir, data


def finetune_argv(args, model_dir: Path, data: Path, out: Path) -> list[str]:
    argv = ["finetune", "--model", str(model_dir), "--data", str(data), "--steps", str(args.steps),
            "--seq-len", str(args.seq_len), "--batch-size", str(args.batch), "--grad-accum", str(args.grad_accum),
            "--lr", str(LR), "--max-grad-norm", "1.0", "--memory-budget", args.budget,
            "--store", str(out / "store"), "--metrics", str(out / "metrics.jsonl"), "--json"]
    return (argv + (["--hardware", args.hardware] if args.hardware else [])
            + (["offload.calibrate=false"] if args.no_calibrate else []))


# ------------------------------------------------------------------------------------------------ children
def run_finetune(args, model_dir: Path, data: Path, out: Path) -> dict:
    """``terastack finetune`` as its command line runs it (its --json result kept for its plan)."""
    import contextlib
    import io

    from terastack.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(finetune_argv(args, model_dir, data, out))
    if code != 0:
        raise SystemExit(code)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"step_s": [x["seconds"] for x in lines if "seconds" in x],
            "losses": [x["loss"] for x in lines if "loss" in x and "seconds" in x],
            "ssd_bytes_per_step": [x["ssd_read_bytes"] + x["ssd_write_bytes"] for x in lines if "seconds" in x],
            "plan": json.loads(printed.getvalue())["plan"]}


def sft_rows(args, data: Path) -> list[list[int]]:
    """The rows finetune's loop takes, in its order ([Note: the data order of a job])."""
    from terastack.training.data.epochs import TokenWindows
    from terastack.training.data.stdlib_corpus import load_tokens

    tokens, _ = load_tokens(str(data), None)
    windows = TokenWindows(tokens, seq_len=args.seq_len, batch_size=args.batch, seed=0)
    return [row.tolist() for i in range(args.steps * args.grad_accum) for row in windows.step_inputs(i)["input_ids"]]


def byte_tokenizer():
    """A tokenizer of the byte vocabulary (the SFTTrainer needs one for its pad token; the rows are token ids)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<0x{i:02X}>": i for i in range(256)} | {"<s>": 256, "</s>": 257, "<pad>": 258}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def run_sft(args, model_dir: Path, data: Path, out: Path) -> dict:
    """The SFT script: the one line ``offload`` added to what a TRL user writes."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    import terastack.hf

    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())

    config = SFTConfig(output_dir=str(out / "trainer"), max_steps=args.steps, per_device_train_batch_size=args.batch,
                       gradient_accumulation_steps=args.grad_accum, learning_rate=LR, lr_scheduler_type="constant",
                       max_grad_norm=1.0, optim="adamw_torch_fused", gradient_checkpointing=False, bf16=False,
                       max_length=args.seq_len, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                       dataloader_num_workers=0, disable_tqdm=True)
    trainer = SFTTrainer(model=terastack.hf.empty_model(str(model_dir)), args=config,
                         train_dataset=Dataset.from_dict({"input_ids": sft_rows(args, data)}),
                         processing_class=byte_tokenizer(), callbacks=[StepEnds()])
    settings = ({"hardware": args.hardware} if args.hardware else {}) | (
        {"calibrate": False} if args.no_calibrate else {})
    start = time.perf_counter()
    terastack.hf.offload(trainer, store=str(out / "store"), memory_budget=args.budget, **settings)
    ends.append(time.perf_counter())
    trainer.train()
    engine = trainer.terastack.engine
    result = {"step_s": [b - a for a, b in zip(ends, ends[1:])], "offload_s": ends[0] - start,
              "engine_step_s": [h.seconds for h in engine.history], "losses": [h.loss for h in engine.history],
              "ssd_bytes_per_step": [h.ssd_read_bytes + h.ssd_write_bytes for h in engine.history],
              "plan": engine.plan.summary()}
    trainer.terastack.close()
    return result


def child(args) -> int:
    """One contender in this process, under its own watchdog; its result as JSON into ``--out``/result.json."""
    from terastack.bench_watchdog import RssWatchdog, peak_rss_bytes
    from terastack.units import parse_bytes

    out = Path(args.out)
    model_dir, data = Path(args.dir) / "model", Path(args.dir) / "data.txt"
    limit = parse_bytes(args.rss_limit, field="--rss-limit")
    with RssWatchdog(RssWatchdog.Config(limit_bytes=limit, interval_s=0.2, include_self=True, on_exceed="exit",
                                        label=f"hf_sft_offload {args.child}")):
        result = (run_sft if args.child == "sft" else run_finetune)(args, model_dir, data, out)
    result["peak_rss_bytes"] = peak_rss_bytes(os.getpid())
    (out / "result.json").write_text(json.dumps(result))
    return 0


def spawn(args, contender: str, out: Path) -> dict:
    """``contender`` in a child process (a new interpreter, or with ``--fork`` a fork of this one)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [a for a in sys.argv[1:] if a != "--json"] + ["--child", contender, "--out", str(out)]
    if args.fork:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child(parse(argv))
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    else:
        code = subprocess.run([sys.executable, __file__, *argv]).returncode
    if code != 0:
        raise SystemExit(f"hf_sft_offload: {contender} ended with status {code} (see its lines above)")
    return json.loads((out / "result.json").read_text())


def main(argv=None) -> int:
    args = parse(argv)
    if args.child:
        return child(args)
    if args.fork:  # the children inherit these imports
        import trl  # noqa: F401

        import terastack.hf  # noqa: F401
    prepare(args)
    results = {c: spawn(args, c, Path(args.dir) / c) for c in CONTENDERS}
    steps = {c: statistics.median(r["step_s"][args.warmup:] or r["step_s"]) for c, r in results.items()}
    summary = {"size": args.size, "model": SIZES[args.size], "budget": args.budget, "seq_len": args.seq_len,
               "batch": args.batch, "grad_accum": args.grad_accum, "steps": args.steps,
               "sft_peak_rss_bytes": results["sft"]["peak_rss_bytes"],
               "finetune_peak_rss_bytes": results["finetune"]["peak_rss_bytes"],
               "sft_step_s": steps["sft"], "finetune_step_s": steps["finetune"],
               "step_ratio": steps["sft"] / steps["finetune"],
               "sft_peak_rss_within_4gib": results["sft"]["peak_rss_bytes"] <= 4 << 30,
               "step_ratio_within_1_1": steps["sft"] / steps["finetune"] <= 1.1, "runs": results}
    for c in CONTENDERS:
        print(f"{c}: peak RSS {results[c]['peak_rss_bytes'] / 2**30:.2f} GiB, step {steps[c]:.3f} s (median after "
              f"{args.warmup} warmup steps)", file=sys.stderr)
    print(f"step ratio sft/finetune {summary['step_ratio']:.3f}", file=sys.stderr)
    for c in CONTENDERS:
        shutil.rmtree(Path(args.dir) / c / "store", ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
