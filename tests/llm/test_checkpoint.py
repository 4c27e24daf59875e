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
from terastack.tiers import Tier
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
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from llm_helpers import batches
from terastack.llm import Trainer, TrainerConfig
from terastack.llm import engine_state
from terastack.tiers import TieredStore
from terastack.training import checkpoint
kill_at, saved = {kill_at!r}, [0]

def die_in_third_checkpoint(where):
    if kill_at == where and saved[0] == 2:
        os.kill(os.getpid(), signal.SIGKILL)

commit, write_json, release = TieredStore.commit, checkpoint.atomic_write_json, engine_state.EngineState.checkpoint_saved
def killed_commit(self, *a, **k):  # the store's manifest names the new pinned commit; no snapshot names it yet
    out = commit(self, *a, **k)
    die_in_third_checkpoint("store-commit")
    return out
def killed_pointer(path, obj):  # the snapshot is in place; LATEST still names the previous one
    if str(path).endswith("LATEST"):
        die_in_third_checkpoint("before-latest")
    return write_json(path, obj)
def killed_release(self, snap):  # LATEST names the new snapshot; the previous commit is still pinned
    die_in_third_checkpoint("before-release")
    return release(self, snap)
TieredStore.commit, checkpoint.atomic_write_json = killed_commit, killed_pointer
engine_state.EngineState.checkpoint_saved = killed_release

cfg = TrainerConfig(**{cfg!r})
data = batches({steps})
with Trainer.from_pretrained({model!r}, cfg) as t:
    torch.manual_seed(5)
    for i, ids in enumerate(data):
        t.step(ids)
        if (i + 1) % 2 == 0:
            t.save_checkpoint({ckpt!r}, beside_store={beside!r})
            saved[0] += 1
            print("checkpoint", i + 1, flush=True)
            if kill_at == "step" and i + 1 == {hold_at}:
                sys.stdin.read()  # held here, however fast the steps ran, until the kill from outside
"""

_UNINTERRUPTED: dict = {}


def uninterrupted_weights(model_dir, config) -> dict:
    """The weights after all 8 steps without a kill (the same for every kill test: the model is seeded)."""
    if not _UNINTERRUPTED:
        with Trainer.from_pretrained(model_dir, config) as full:
            torch.manual_seed(5)
            for ids in batches(8):
                full.step(ids)
            _UNINTERRUPTED.update(full.state_dict())
    return _UNINTERRUPTED


def run_killed(tmp_path, config, model_dir, *, beside: bool, kill_at: str, steps: int = 8,
               kill_after: int = 4) -> None:
    """Train ``steps`` steps of ``model_dir`` under ``config`` in a real process (store ``tmp_path/store-killed``),
    a checkpoint to ``tmp_path/ckpt`` every two steps, and end it with SIGKILL: at ``kill_at`` inside the
    driver's third checkpoint, or (``kill_at`` "step") from here once checkpoint ``kill_after`` is written: during
    the two steps after it or while the next checkpoint is written, the process holding there (it cannot finish
    first on a busy machine) once that checkpoint is written."""
    fields = config.replace(store_dir=str(tmp_path / "store-killed")).to_dict()   # the settings, by flat name
    script = KILL_DRIVER.format(tests=os.path.dirname(__file__), cfg=fields, model=str(model_dir),
                                ckpt=str(tmp_path / "ckpt"), beside=beside, kill_at=kill_at, steps=steps,
                                hold_at=kill_after + 2)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith(f"checkpoint {kill_after}") and kill_at == "step":
                os.kill(proc.pid, signal.SIGKILL)  # during the next two steps, or while writing the next checkpoint
                break
            if not line:
                break
    finally:
        proc.stdin.close()  # a process held and never killed goes on (and the assertion below says so)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the training process was not killed"


def resume_killed(tmp_path, config, *, beside: bool, steps: int = 8) -> tuple[int, dict]:
    """Resume ``run_killed``'s last checkpoint and train to ``steps``: the step it resumed at and the weights."""
    data = batches(steps)
    with Trainer.load_checkpoint(tmp_path / "ckpt", config) as resumed:
        step = resumed.step_count
        if beside:  # resumed in the killed run's store, no copy of it
            assert resumed.run_dir.parent == tmp_path / "store-killed"
            assert resumed.store.pinned_generations() == [resumed.store.last_commit().generation]
        for ids in data[step:]:
            resumed.step(ids)
        return step, resumed.state_dict()


@pytest.mark.parametrize("beside, kill_at, resumes_at", [
    (False, "step", (4, 6)),
    (True, "step", (4, 6)),             # during step 5 or 6, or while writing the next checkpoint
    (True, "store-commit", (4,)),       # the store pinned the step-6 commit; no snapshot names it
    (True, "before-latest", (4,)),      # the step-6 snapshot is in place, LATEST names step 4's
    (True, "before-release", (6,)),     # LATEST names step 6's; step 4's commit is still pinned
])
def test_kill_9_loses_only_steps_since_the_checkpoint(tmp_path, trainer_config, beside, kill_at, resumes_at):
    """A process killed with SIGKILL mid-training, or at each point of writing a checkpoint (copied, or beside
    the store), resumes from its last checkpoint to the same weights as a run never killed."""
    make_model("llama", tmp_path / "model")
    run_killed(tmp_path, trainer_config(), tmp_path / "model", beside=beside, kill_at=kill_at)
    step, got = resume_killed(tmp_path, trainer_config(), beside=beside)
    assert step in resumes_at
    expected = uninterrupted_weights(tmp_path / "model", trainer_config())
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_checkpoint_beside_the_store_copies_nothing_and_resumes_in_place(tmp_path, trainer_config, store_dirs):
    """The snapshot refers to the store's pinned commit (no tensor bytes of its own); after training on, the
    bytes held for it are the records rewritten since; the store outlives the trainer and a resume continues in it
    to the uninterrupted weights; a later checkpoint lets the earlier commit go."""
    from pathlib import Path

    make_model("gpt2", tmp_path / "model")
    data = batches(5)
    cfg = trainer_config(store_dir=store_dirs, state_placement="ssd")  # masters and moments rewritten on the SSD
    with Trainer.from_pretrained(tmp_path / "model", cfg) as full:
        offloaded_train(full, data[:2])
        live = full.store.usage()["ssd"]["live"]
        snap = full.save_checkpoint(tmp_path / "ckpt", beside_store=True)
        assert (snap / "state.bin").stat().st_size == 0
        assert full.store.usage()["ssd"]["held"] == 0
        for ids in data[2:]:
            full.step(ids)
        held = full.store.usage()["ssd"]["held"]
        assert 0 < held <= live  # the pinned versions of what was rewritten since, at most the state once
        expected = full.state_dict()
        run_dirs = list(full.run_dirs)
    assert all(d.exists() for d in run_dirs)  # the checkpoint needs them
    with Trainer.load_checkpoint(tmp_path / "ckpt", cfg) as resumed:
        assert resumed.run_dirs == run_dirs and resumed.step_count == 2
        for ids in data[2:]:
            resumed.step(ids)
        assert all(torch.equal(resumed.state_dict()[k], expected[k]) for k in expected)
        first = resumed.store.pinned_generations()
        resumed.save_checkpoint(tmp_path / "ckpt", beside_store=True)
        assert resumed.store.pinned_generations() != first and len(resumed.store.pinned_generations()) == 1
        assert resumed.store.usage()["ssd"]["held"] == 0
    assert all(Path(d).exists() for d in run_dirs)


def test_a_resume_beside_the_store_under_another_placement_copies_nothing(tmp_path, trainer_config):
    """The run's state rested on the SSD; the resuming budget places it in host memory (a process's memory left is
    never the same twice): each record changes its home in place, so the checkpoint holds nothing beyond the store
    until the resumed run rewrites a record, and training continues to the uninterrupted weights."""
    make_model("llama", tmp_path / "model")
    data = batches(4)
    cfg = trainer_config(state_placement="ssd")
    with Trainer.from_pretrained(tmp_path / "model", cfg) as full:
        offloaded_train(full, data[:2])
        full.save_checkpoint(tmp_path / "ckpt", beside_store=True)
        for ids in data[2:]:
            full.step(ids)
        expected = full.state_dict()
    roomy = trainer_config(state_placement="auto", host_budget="256MiB")
    with Trainer.load_checkpoint(tmp_path / "ckpt", roomy) as resumed:
        homes = {resumed.store.record(r).home for r in resumed.store.names()}
        assert Tier.HOST in homes  # the resuming plan placed records elsewhere than the run that wrote them
        assert resumed.store.usage()["ssd"]["held"] == 0  # and nothing was rewritten to get them there
        for ids in data[2:]:
            resumed.step(ids)
        assert all(torch.equal(resumed.state_dict()[k], expected[k]) for k in expected)


def test_a_checkpoint_beside_a_missing_or_other_store_is_refused(tmp_path, trainer_config):
    import shutil

    make_model("llama", tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        t.step(batches(1)[0])
        t.save_checkpoint(tmp_path / "ckpt", beside_store=True)
        run_dir = t.run_dir
    saved = tmp_path / "saved-store"
    shutil.copytree(run_dir, saved)
    (run_dir / "data.bin").unlink()
    with pytest.raises(FileNotFoundError, match="data.bin.*missing|missing"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config())
    shutil.rmtree(run_dir)
    shutil.copytree(saved, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["versions"]["store_id"] = "another store"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not the one it was written beside"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config())
    assert (run_dir / "data.bin").exists()  # a refused resume leaves the store it opened where it was
    manifest["versions"]["pinned"] = {}
    manifest["versions"]["store_id"] = json.loads((saved / "manifest.json").read_text())["versions"]["store_id"]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="moved past this checkpoint|no longer keeps"):
        Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config())
