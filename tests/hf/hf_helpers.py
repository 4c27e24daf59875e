"""Shared helpers of the terastack.hf tests: tiny models, token rows, one training script run with and without
``offload``, and the comparison of what each ended with (saved weights, logged figures)."""
from __future__ import annotations

import os
import random

import torch

VOCAB = 96
#: the engine's settings every offloaded run takes: its state on the SSD (a test machine's description, no probe)
OFFLOAD = dict(memory_budget="8MiB", state_placement="ssd", calibrate=False)
#: the TrainingArguments of the equality runs: each honoured argument away from its default
ARGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-2, weight_decay=0.1,
            adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-5, max_grad_norm=0.5, lr_scheduler_type="cosine",
            lr_scheduler_kwargs={"num_cycles": 0.4}, warmup_steps=1, max_steps=4, seed=3, data_seed=11,
            logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
#: logged figures compared between the two runs (those present in either)
FIGURES = ("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens", "eval_loss",
           "train_loss", "eval_entropy", "eval_mean_token_accuracy")


def tiny_config(family: str, *, dropout: float = 0.1, hidden: int = 32):
    from transformers import GPTNeoXConfig, LlamaConfig, Qwen2Config

    # attention dropout: the run draws from the RNG the Trainer seeds (args.seed), in the same order either way
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4,
                  max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=2, attention_dropout=dropout)
    if family == "llama":
        return LlamaConfig(num_key_value_heads=2, **common)
    if family == "qwen2":
        return Qwen2Config(num_key_value_heads=2, **common)
    if family == "gpt_neox":
        return GPTNeoXConfig(**common)
    raise ValueError(family)


def tiny_model(family: str, *, vocab: int = VOCAB, seed: int = 0, dropout: float = 0.1, hidden: int = 32):
    from transformers import AutoModelForCausalLM

    config = tiny_config(family, dropout=dropout, hidden=hidden)
    config.vocab_size = vocab
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def token_rows(n: int = 16, *, seed: int = 0, lo: int = 6, hi: int = 16):
    """A datasets.Dataset of ``n`` rows of random token ids of lengths in [lo, hi] (labels: the ids; the collator
    pads and masks)."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=g))
        ids = torch.randint(3, VOCAB, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": ids})
    return Dataset.from_list(rows)


def pad_collate(examples):
    """Rows padded on the right: pad id 2, label -100, attention 0."""
    longest = max(len(e["input_ids"]) for e in examples)
    out = {"input_ids": torch.full((len(examples), longest), 2, dtype=torch.long),
           "labels": torch.full((len(examples), longest), -100, dtype=torch.long),
           "attention_mask": torch.zeros((len(examples), longest), dtype=torch.long)}
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        out["input_ids"][i, :n] = torch.tensor(e["input_ids"])
        out["labels"][i, :n] = torch.tensor(e["labels"])
        out["attention_mask"][i, :n] = 1
    return out


def log_callback(logs: list):
    from transformers import TrainerCallback

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            sink.append(dict(logs or {}))

    sink = logs
    return Logs()


def offload(trainer, tmp_path, hardware: str, **settings):
    import terastack.hf

    return terastack.hf.offload(trainer, store=str(tmp_path / "store"), hardware=hardware, **{**OFFLOAD, **settings})


def saved_weights(trainer, path) -> dict[str, torch.Tensor]:
    """``trainer.save_model(path)``, read back as transformers loads it."""
    from safetensors.torch import load_file

    trainer.save_model(str(path))
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        out.update(load_file(os.path.join(path, f)))
    return out


def assert_same_run(plain: tuple, offloaded: tuple, *, atol: float = 1e-5) -> None:
    """Both runs' saved weights within ``atol`` and their logged figures within ``atol`` (relative), line by
    line; ``(weights, logs)`` each."""
    (w0, logs0), (w1, logs1) = plain, offloaded
    assert sorted(w0) == sorted(w1)
    worst = max(((w0[k] - w1[k]).abs().max().item(), k) for k in w0)
    assert worst[0] <= atol, f"saved weight {worst[1]} differs by {worst[0]:.3g}"
    assert len(logs0) == len(logs1)
    for line0, line1 in zip(logs0, logs1):
        for key in FIGURES:
            if key in line0 or key in line1:
                a, b = line0[key], line1[key]
                assert abs(a - b) <= atol * max(1.0, abs(a)), f"{key}: {a} (plain) vs {b} (offloaded)"


def dataset(kind: str, n: int = 16):
    """TRL's data kinds over the chat tokenizer's words: "text", "prompt_completion" or "conversational"."""
    from datasets import Dataset

    from ..chat_tokenizer import WORDS

    rnd = random.Random(0)

    def words(k):
        return " ".join(rnd.choice(WORDS[8:]) for _ in range(k))

    if kind == "text":
        rows = [{"text": words(rnd.randint(3, 10))} for _ in range(n)]
    elif kind == "prompt_completion":
        rows = [{"prompt": words(rnd.randint(2, 5)), "completion": words(rnd.randint(2, 5))} for _ in range(n)]
    else:
        rows = [{"messages": [{"role": "user", "content": words(3)},
                              {"role": "assistant", "content": words(rnd.randint(2, 5))}]} for _ in range(n)]
    return Dataset.from_list(rows)
