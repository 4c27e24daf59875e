"""empty_model: a Trainer built around a model with no weights in memory; offload fills the store from its
checkpoint files one tensor at a time; the run equals the plain Trainer's over from_pretrained."""
import pytest
import torch

from ..llm.llm_helpers import AliveTensors
from .hf_helpers import ARGS, assert_same_run, log_callback, offload, pad_collate, saved_weights, tiny_model, token_rows


def run(tmp_path, model, *, name, hardware=None):
    from transformers import Trainer, TrainingArguments

    logs = []
    args = TrainingArguments(output_dir=str(tmp_path / name), **ARGS)
    trainer = Trainer(model=model, args=args, train_dataset=token_rows(), data_collator=pad_collate,
                      callbacks=[log_callback(logs)])
    if hardware is not None:
        offload(trainer, tmp_path / name, hardware)
    trainer.train()
    return saved_weights(trainer, tmp_path / name / "saved"), logs, trainer


def test_empty_model_equals_from_pretrained(tmp_path, hardware_file, monkeypatch):
    from transformers import AutoModelForCausalLM

    import terastack.hf
    from terastack.training.hf.model_files import CheckpointReader

    tiny_model("gpt_neox", dropout=0.0).save_pretrained(str(tmp_path / "model"))
    plain = run(tmp_path, AutoModelForCausalLM.from_pretrained(str(tmp_path / "model")), name="plain")

    empty = terastack.hf.empty_model(str(tmp_path / "model"), dtype=torch.float32, attn_implementation="sdpa")
    assert all(p.device.type == "meta" for p in empty.parameters())
    alive = AliveTensors()
    read = CheckpointReader.get
    monkeypatch.setattr(CheckpointReader, "get", lambda self, key: alive.track(read(self, key)))
    weights, logs, trainer = run(tmp_path, empty, name="offloaded", hardware=hardware_file)
    assert alive.calls == len(plain[0]) and alive.peak <= 2  # every tensor read once, one at a time
    assert_same_run(plain[:2], (weights, logs))
    trainer.terastack.close()


def test_empty_model_refuses_what_it_cannot_honour(tmp_path):
    import terastack.hf

    tiny_model("llama").save_pretrained(str(tmp_path / "model"))
    with pytest.raises(ValueError, match="trust_remote_code=True is not served"):
        terastack.hf.empty_model(str(tmp_path / "model"), trust_remote_code=True)
    with pytest.raises(ValueError, match="quantization_config: served is bitsandbytes' 4-bit NF4"):
        terastack.hf.empty_model(str(tmp_path / "model"), quantization_config={"load_in_8bit": True})
    with pytest.raises(FileNotFoundError, match="neither a model directory nor a Hugging Face Hub id"):
        terastack.hf.empty_model(str(tmp_path / "missing" / "model"))
