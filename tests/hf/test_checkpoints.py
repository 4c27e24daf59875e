"""checkpoint-N folders under the engine: resuming equals the run never stopped, to the bit; save_model writes a
directory from_pretrained loads; evaluate() gives the plain Trainer's eval loss."""
import json
import os

import pytest
import torch

from .hf_helpers import ARGS, log_callback, offload, pad_collate, saved_weights, tiny_model, token_rows


def trainer_for(tmp_path, hardware=None, *, output="out", **changes):
    from transformers import Trainer, TrainingArguments

    logs = []
    args = TrainingArguments(output_dir=str(tmp_path / output), **{**ARGS, "save_strategy": "steps", "save_steps": 2,
                                                                  "per_device_eval_batch_size": 2, **changes})
    trainer = Trainer(model=tiny_model("llama"), args=args, train_dataset=token_rows(), eval_dataset=token_rows(4, seed=9),
                      data_collator=pad_collate, callbacks=[log_callback(logs)])
    if hardware is not None:
        offload(trainer, tmp_path / output, hardware)
    return trainer, logs


def test_resume_from_checkpoint_equals_the_run_never_stopped(tmp_path, hardware_file):
    whole, whole_logs = trainer_for(tmp_path, hardware_file)
    whole.train()
    expected = saved_weights(whole, tmp_path / "whole")
    whole.terastack.close()
    ckpt = tmp_path / "out" / "checkpoint-2"
    assert {"terastack", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
            "model.safetensors", "config.json"} <= set(os.listdir(ckpt))
    # the Trainer's own files beside the engine's state: the run stops after step 2 (checkpoint-4 gone), then resumes
    import shutil

    shutil.rmtree(tmp_path / "out" / "checkpoint-4")
    resumed, logs = trainer_for(tmp_path, hardware_file)
    resumed.train(resume_from_checkpoint=True)  # the latest checkpoint-N of the output directory: checkpoint-2
    got = saved_weights(resumed, tmp_path / "resumed")
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    steps = [line for line in logs if "loss" in line]
    assert [(x["loss"], x["grad_norm"], x["learning_rate"]) for x in steps] == \
        [(x["loss"], x["grad_norm"], x["learning_rate"]) for x in whole_logs if "loss" in x][2:]
    resumed.terastack.close()


def test_save_model_and_evaluate_match_the_plain_trainer(tmp_path, hardware_file):
    from transformers import AutoModelForCausalLM

    # one after the other: a Trainer seeds the RNG (its dropout draws) when it is built
    plain, _ = trainer_for(tmp_path, output="plain")
    before = plain.evaluate()["eval_loss"]
    plain.train()
    after = plain.evaluate()["eval_loss"]
    offloaded, _ = trainer_for(tmp_path, hardware_file)
    # a checkpoint written without offload() holds no engine state: refused by name, before any step
    with pytest.raises(FileNotFoundError, match="checkpoint-2 has no terastack/ folder"):
        offloaded.train(resume_from_checkpoint=str(tmp_path / "plain" / "checkpoint-2"))
    assert offloaded.evaluate()["eval_loss"] == pytest.approx(before, rel=1e-6)
    offloaded.train()
    assert offloaded.evaluate()["eval_loss"] == pytest.approx(after, rel=1e-5)
    offloaded.save_model()  # into the output directory, beside its checkpoint folders
    out = tmp_path / "out"
    assert {"checkpoint-2", "checkpoint-4", "model.safetensors", "config.json"} <= set(os.listdir(out))
    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    for name, p in plain.model.named_parameters():
        assert torch.allclose(loaded.get_parameter(name), p, atol=1e-5), name
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    offloaded.terastack.close()


def test_load_best_model_at_end_takes_the_best_checkpoints_weights(tmp_path, hardware_file):
    from safetensors.torch import load_file

    trainer, _ = trainer_for(tmp_path, hardware_file, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
                             metric_for_best_model="eval_loss", greater_is_better=True)  # the worse loss: not the last
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and best.endswith("checkpoint-2")
    saved = load_file(os.path.join(best, "model.safetensors"))
    engine = trainer.terastack.engine
    assert all(torch.equal(engine.parameter(name), t) for name, t in saved.items())
    trainer.terastack.close()
