"""Checkpoints resume exactly (also after kill -9), are verified on load, and export loads in transformers."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from .llm_helpers import batches, make_model, max_weight_diff, offloaded_train, reference_train
from terastack.llm import Trainer
from terastack.training.checkpoint import JSONState


def test_resume_reaches_the_uninterrupted_weights(tmp_path, trainer_config, store_dirs):
    """Also with the store spanning two directories: the checkpoint written from it resumes (into a store over
    the same directories) and the run dirs are removed on close."""
    from pathlib import Path

    make_model("gpt2", tmp_path / "model")  # tied embeddings and dropout: the RNG state is part of the state
    data = batches(5)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(max_grad_norm=1.0, store_dir=store_dirs)) as full:
        assert len(full.run_dirs) == len(store_dirs.split(","))
        offloaded_train(full, data[:2])
        snap = full.save_checkpoint(tmp_path / "ckpt", extra={"note": "two steps"})
        for ids in data[2:]:
            full.step(ids)
        expected = full.state_dict()
    assert snap.name == "step-00000002" and json.loads((tmp_path / "ckpt" / "LATEST").read_text())["step"] == 2
    extra = JSONState()
    with Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config(max_grad_norm=1.0, store_dir=store_dirs),
                                 components={"extra": extra}) as resumed:
        assert resumed.step_count == 2 and extra.value == {"note": "two steps"}
        for ids in data[2:]:
            resumed.step(ids)
        got = resumed.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)
    assert all(not any(Path(d).iterdir()) for d in store_dirs.split(","))  # every run dir removed


def test_checkpoint_keeps_only_the_latest_complete_snapshot(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        t.step(batches(1)[0])
        t.save_checkpoint(tmp_path / "ckpt")
        (tmp_path / "ckpt" / ".tmp-step-00000009-123").mkdir()  # debris of a crashed writer
        t.step(batches(1)[0])
        t.save_checkpoint(tmp_path / "ckpt")
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["LATEST", "step-00000002"]


def test_corrupt_or_truncated_checkpoint_is_refused(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        t.step(batches(1)[0])
        snap = t.save_checkpoint(tmp_path / "ckpt")
    data = snap / "state.bin"
    manifest = json.loads((snap / "checkpoint.json").read_text())
    entry = manifest["tensors"]["model/master:model.layers.1.mlp.up_proj.weight"]
    original = data.read_bytes()
    with open(data, "r+b") as f:  # flip one byte inside one tensor
        f.seek(entry["offset"] + 10)
        b = f.read(1)
        f.seek(entry["offset"] + 10)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ValueError, match=r"state.bin.*model.layers.1.mlp.up_proj.weight.*checksum"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config())
    data.write_bytes(original[: len(original) // 2])
    with pytest.raises(ValueError, match="truncated"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config())
    (snap / "checkpoint.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Trainer.load_checkpoint(tmp_path / "nowhere", trainer_config())


def test_resume_from_another_models_checkpoint_is_refused(tmp_path, trainer_config):
    from .llm_helpers import tiny_config

    make_model("llama", tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        t.save_checkpoint(tmp_path / "ckpt")
    before = sorted(p.name for p in (tmp_path / "ckpt").rglob("*"))
    with pytest.raises(ValueError, match="another model.*num_hidden_layers"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config(), expect_model=tiny_config("llama", layers=2))
    with pytest.raises(ValueError, match="another model.*model_type"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config(), expect_model=tiny_config("opt"))
    assert sorted(p.name for p in (tmp_path / "ckpt").rglob("*")) == before  # nothing on disk touched


def test_save_pretrained_loads_in_transformers(tmp_path, trainer_config):
    from transformers import AutoModelForCausalLM

    ref = make_model("opt", tmp_path / "model")
    data = batches(2)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        offloaded_train(t, data)
        out = t.save_pretrained(tmp_path / "export")
        reference_train(ref, data)
        assert max_weight_diff(t, ref) <= 1e-5
    assert {"config.json", "model.safetensors", "generation_config.json"} == set(os.listdir(out))
    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    for (n, p), (n2, q) in zip(ref.named_parameters(), loaded.named_parameters()):
        assert n == n2 and (p - q).abs().max() <= 1e-5
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight  # ties restored by transformers
    ref.eval()
    ids = data[0]
    assert torch.allclose(loaded(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-5)


KILL_DRIVER = r"""
import sys, torch
sys.path.insert(0, {tests!r})
from llm_helpers import batches
from terastack.llm import Trainer, TrainerConfig
cfg = TrainerConfig(**{cfg!r})
data = batches(8)
with Trainer.from_pretrained({model!r}, cfg) as t:
    torch.manual_seed(5)
    for i, ids in enumerate(data):
        t.step(ids)
        if (i + 1) % 2 == 0:
            t.save_checkpoint({ckpt!r})
            print("checkpoint", i + 1, flush=True)
"""


def test_kill_9_loses_only_steps_since_the_checkpoint(tmp_path, trainer_config):
    """A process killed with SIGKILL mid-training resumes from its last checkpoint to the same weights."""
    make_model("llama", tmp_path / "model")
    cfg = trainer_config()
    fields = {k: v for k, v in cfg.to_dict().items() if k != "lora"}
    fields["store_dir"] = str(tmp_path / "store-killed")
    script = KILL_DRIVER.format(tests=os.path.dirname(__file__), cfg=fields, model=str(tmp_path / "model"),
                                ckpt=str(tmp_path / "ckpt"))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("checkpoint 4"):
                break
            assert line, "the training process ended before its second checkpoint"
        os.kill(proc.pid, signal.SIGKILL)  # during step 5 or 6, or while writing the next checkpoint
    finally:
        proc.wait(timeout=60)
    data = batches(8)
    with Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config()) as resumed:
        step = resumed.step_count
        assert step in (4, 6)
        for ids in data[step:]:
            resumed.step(ids)
        got = resumed.state_dict()
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as full:
        torch.manual_seed(5)
        for ids in data:
            full.step(ids)
        expected = full.state_dict()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
