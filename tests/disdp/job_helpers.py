"""A tiny chat job for the disaggregated engine: a Llama saved with save_pretrained beside a word-level tokenizer
with a chat template (built locally, nothing downloads), chat JSONL records and the job file both engines read."""
from __future__ import annotations

import json

from ..chat_tokenizer import save_chat_tokenizer

CHATS = [
    [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "fine"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "how are you"},
     {"role": "assistant", "content": "fine fine"}],
    [{"role": "user", "content": "tell me"}, {"role": "assistant", "content": "you are fine"},
     {"role": "user", "content": "how"}, {"role": "assistant", "content": "brief"}],
    [{"role": "user", "content": "are you there"}, {"role": "assistant", "content": "hi"}],
    [{"role": "user", "content": "tell me how"}, {"role": "assistant", "content": "be fine there"}],
    [{"role": "user", "content": "you"}, {"role": "assistant", "content": "me"}],
    [{"role": "user", "content": "hi hi"}, {"role": "assistant", "content": "how are you there"}],
]


def make_chat_model(path, *, seed: int = 0, layers: int = 2, hidden: int = 16) -> str:
    """A Llama (2 layers of width 16 unless told, vocabulary 32) and its tokenizer saved into ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    save_chat_tokenizer(path)
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=32, max_position_embeddings=64, bos_token_id=0,
                         eos_token_id=1, pad_token_id=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    return str(path)


def write_chat_job(tmp_path, *, workers: int = 2, clip: float | None = None, steps: int = 3, model_size=(2, 16),
                   **extra) -> str:
    """The job file: the model and data above, 3 steps of 3 rows with 2 micro-batches, warmup and a decay.
    ``model_size``: (layers, hidden) of the model; ``extra``: more settings, ``section.field=value``."""
    model = tmp_path / "model"
    if not model.exists():
        make_chat_model(model, layers=model_size[0], hidden=model_size[1])
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    job = {"model": {"path": str(model)}, "data": {"path": str(data)}, "validation": {"fraction": 0.0},
           "training": {"steps": steps, "seq_len": 16, "batch_size": 3, "grad_accum": 2, "lr": 0.01,
                        "warmup_steps": 1, "lr_schedule": "linear", "weight_decay": 0.01,
                        "max_grad_norm": clip},
           "offload": {"calibrate": False},
           "disdp": {"workers": workers, "servers": 2 if workers > 1 else 1, "timeout_s": 60,
                     "run_dir": str(tmp_path / f"run-w{workers}")}}
    for path, value in extra.items():
        section, name = path.split("__")
        job.setdefault(section, {})[name] = value
    out = tmp_path / f"job-w{workers}-{'clip' if clip else 'noclip'}.json"
    # JSON is YAML: the job file both commands read
    out = out.with_suffix(".yaml")
    out.write_text(json.dumps(job))
    return str(out)


def finetune_export(job_file: str, out, store, *more) -> dict:
    """``terastack finetune`` on the job file: its export's tensors (the reference of the disaggregated jobs)."""
    from terastack.cli import main

    from ..exported import exported_weights

    assert main(["finetune", "--config", job_file, "--output", str(out), "--store", str(store), *more]) == 0
    return exported_weights(out)
