"""What a new user meets around `terastack finetune`: a store whose parent is missing, scratch directories left
in the temporary directory, job files that only run from where they were written, Ctrl-C and resuming, the LoRA
learning rate, token counts, RoPE scaling and how settings are named in errors."""
import json
import shlex
import tempfile

import numpy as np
import pytest
import torch

from terastack.cli import main

SEQ = 16


def _byte_model(path, max_positions: int = 64):
    """A tiny Llama over the byte vocabulary (BOS/EOS/PAD included), saved without a tokenizer: bytes."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      bos_token_id=256, eos_token_id=257, pad_token_id=258)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    return str(path)


def _text(path, n: int, seed: int = 0):
    alphabet = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789\n", dtype=np.uint8)
    path.write_bytes(alphabet[np.random.default_rng(seed).integers(0, len(alphabet), n)].tobytes())
    return str(path)


@pytest.fixture
def setup(tmp_path, hardware_file, capsys, monkeypatch):
    """A model and training text in tmp_path/work, the working directory; a private temporary directory."""
    work = tmp_path / "work"
    work.mkdir()
    _byte_model(work / "model")
    _text(work / "train.txt", 12 * SEQ + 3)
    scratch_tmp = tmp_path / "tmp"
    scratch_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_tmp))
    monkeypatch.chdir(work)
    capsys.readouterr()  # whatever importing transformers printed
    return {"work": work, "tmp": scratch_tmp,
            "base": ["finetune", "--model", "model", "--data", "train.txt", "--seq-len", str(SEQ), "--batch-size",
                     "2", "--device-budget", "64MiB", "--host-budget", "64MiB", "--no-calibrate", "--hardware",
                     hardware_file, "--optimizer-impl", "single"]}


# ------------------------------------------------------------------ #4: the store and scratch directories
def test_a_store_whose_parent_is_missing_is_refused_and_failed_runs_leave_no_scratch(setup, tmp_path, capsys):
    from terastack.llm.engine.store_layout import make_run_dirs

    missing = tmp_path / "mnt" / "nvme1" / "run"
    assert main([*setup["base"], "--steps", "1", "--store", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing.parent) in err and "does not exist" in err
    assert not (tmp_path / "mnt").exists()  # nothing made on the wrong disk
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "mnt" / "nvme1")):
        make_run_dirs([str(tmp_path / "ok"), str(missing)], 0)
    assert not list((tmp_path / "ok").iterdir())  # the run directory made in the good one is removed again
    # the store directory itself may be new
    runs = make_run_dirs(str(tmp_path / "new"), 0)
    assert runs[0].parent == tmp_path / "new"
    # runs that fail, early or late, leave no terastack-finetune-* scratch behind
    assert main([*setup["base"], "--steps", "1", "--data", "missing.txt"]) == 2
    assert main([*setup["base"], "--steps", "1", "--lr", "-1"]) == 2
    assert main([*setup["base"], "--steps", "1", "--seq-len", "4096", "--model", "tiny-gpt2"]) == 2
    capsys.readouterr()
    assert list(setup["tmp"].glob("terastack-finetune-*")) == []


# ------------------------------------------------------------------ #5: a saved job runs from anywhere
def test_the_saved_job_names_every_path_absolute_and_runs_from_another_directory(setup, tmp_path, capsys,
                                                                                  monkeypatch):
    work = setup["work"]
    (work / "val.txt").write_bytes(b"HELLO WORLD 42\n" * 4)
    args = [*setup["base"], "--steps", "2", "--lora", "2", "--val-data", "val.txt", "--store", "store",
            "--checkpoint", "ck", "--output", "out", "--metrics", "m.jsonl", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    saved = (work / "out" / "finetune.yaml").read_text()
    import yaml

    job = yaml.safe_load(saved)
    assert job["model"]["path"] == str(work / "model") and job["data"]["path"] == str(work / "train.txt")
    assert job["validation"]["data"] == str(work / "val.txt") and job["store"]["dirs"] == str(work / "store")
    assert job["checkpoint"]["dir"] == str(work / "ck") and job["output"]["dir"] == str(work / "out")
    assert job["output"]["metrics"] == str(work / "m.jsonl")
    # LoRA without --lr trains at 1e-4 (not full fine-tuning's 1e-5), written into the job
    assert job["training"]["lr"] == pytest.approx(1e-4)
    adapter = json.loads((work / "out" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(work / "model")
    # the same job from another directory: the same losses
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["finetune", "--config", str(work / "out" / "finetune.yaml"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["losses"] == pytest.approx(first["losses"], rel=1e-6)
    assert list(elsewhere.iterdir()) == []  # every file went where the job says, nothing here


# ------------------------------------------------------------------ #6: Ctrl-C and resuming
def test_ctrl_c_says_where_the_run_stood_and_how_to_resume(setup, capsys, monkeypatch):
    from terastack.llm.trainer import Trainer

    original = Trainer.step

    def interrupted(self, *a, **k):
        if self.step_count == 3:
            raise KeyboardInterrupt
        return original(self, *a, **k)

    monkeypatch.setattr(Trainer, "step", interrupted)
    args = [*setup["base"], "--steps", "6", "--store", "store", "--checkpoint", "ck", "--checkpoint-every", "2"]
    assert main(args) == 130
    err = capsys.readouterr().err.strip().splitlines()
    line = err[-1]
    assert line.startswith("interrupted at step 3 of 6; last checkpoint ck (step 2); resume with: terastack "
                           "finetune "), line
    assert "optimizer update failed" not in "\n".join(err) and "Traceback" not in "\n".join(err)
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[-2:] == ["--resume", "ck"] and command[1:-2] == args
    monkeypatch.setattr(Trainer, "step", original)
    assert main(command[1:]) == 0  # the command as printed
    err = capsys.readouterr().err
    assert "resumed from ck at step 2" in err  # without --json too
    assert "finetune: 6/6 step" in err and "finetune: 4/4 step" not in err  # its true position
    # no checkpoint: it says so
    monkeypatch.setattr(Trainer, "step", interrupted)
    assert main([*setup["base"], "--steps", "6", "--store", "store"]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("interrupted at step 3 of 6; no checkpoint to resume from"), line


def test_ctrl_c_during_an_optimizer_update_is_an_interrupt_not_a_failed_update(setup, capsys, monkeypatch):
    """On the CPU updates run inline on the training thread: a Ctrl-C landing in one propagates as itself."""
    from terastack.llm.engine.optimizer import OffloadedAdamW

    original = OffloadedAdamW._update
    calls = []

    def update(self, task, nxt):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, task, nxt)

    monkeypatch.setattr(OffloadedAdamW, "_update", update)
    assert main([*setup["base"], "--steps", "3", "--store", "store"]) == 130
    err = capsys.readouterr().err
    assert "optimizer update failed" not in err and err.strip().splitlines()[-1].startswith("interrupted at step")


def test_progress_of_a_resumed_loop_counts_from_its_position():
    import io

    from terastack.progress import Progress

    out = io.StringIO()
    p = Progress(120, initial=50, label="finetune", unit="step", stream=out, log_every=0.0)
    p.update(1)
    assert out.getvalue().startswith("finetune: 51/120 step")


# ------------------------------------------------------------------ #9: token counts
def test_tokens_are_the_real_ones_and_the_targets_those_in_the_loss():
    from terastack.training.data.examples import Example, pad_batch
    from terastack.training.metrics import count_tokens

    pad = eos = 7  # a tokenizer without a pad token pads with its EOS
    examples = [Example(ids=np.array([1, 2, 3, 4, eos]), labels=np.array([-100, -100, 3, 4, eos])),
                Example(ids=np.array([5, 6, eos]), labels=np.array([-100, 6, eos])),
                Example(ids=np.array([9, eos]), labels=np.array([-100, -100]))]  # all prompt, no target
    ids, labels = pad_batch(examples, pad)
    assert ids.shape == (3, 5)
    real, target = count_tokens([{"input_ids": ids, "labels": labels}], pad_id=pad)
    # the third row's EOS is outside the loss and equals the pad: still, positions after the last non-pad are pads
    assert real == 5 + 3 + 1 and target == 3 + 2
    assert count_tokens([{"input_ids": ids, "labels": labels}]) == (15, 5)  # no pad id: every token is real
    mask = torch.tensor([[1, 1, 1, 0]])
    assert count_tokens([{"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": mask}]) == (3, 3)


def test_metrics_of_padded_records_count_real_and_target_tokens(setup, capsys):
    work = setup["work"]
    records = [{"prompt": "Q" * n, "completion": "A" * (n + 1)} for n in (1, 2, 4, 5)]  # none cut at SEQ
    (work / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main([*setup["base"], "--data", "r.jsonl", "--val-fraction", "0", "--batch-size", "4", "--steps", "2",
                 "--store", "store", "--metrics", "m.jsonl", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    lines = [json.loads(x) for x in (work / "m.jsonl").read_text().splitlines() if "loss" in json.loads(x)]
    # every step holds all four examples, each BOS + prompt + completion + EOS (byte tokens), padded to 13
    real = [r["tokens"] for r in lines]
    targets = [r["target_tokens"] for r in lines]
    assert real == [sum(len(r["prompt"]) + len(r["completion"]) + 2 for r in records)] * 2  # 36, not 4 x 13
    assert targets == [sum(len(r["completion"]) + 1 for r in records)] * 2  # completions and their EOS
    assert result["tokens"] == sum(real) and result["target_tokens"] == sum(targets)


# ------------------------------------------------------------------ #9: RoPE scaling, names in errors
def test_rope_scaling_extends_a_rotary_model_and_the_warning_is_printed_once(setup, capsys):
    work = setup["work"]
    _text(work / "long.txt", 8 * 96 + 3)
    args = [*setup["base"], "--data", "long.txt", "--seq-len", "96", "--steps", "1", "--store", "store"]
    assert main(args) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "max_position_embeddings 64" in line]
    assert len(warnings) == 1 and "--rope-scaling" in warnings[0]
    assert main([*args, "--rope-scaling", "linear", "2", "--output", "scaled"]) == 0
    err = capsys.readouterr().err
    assert "max_position_embeddings" not in err
    cfg = json.loads((work / "scaled" / "config.json").read_text())
    assert cfg["max_position_embeddings"] == 128
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    assert scaling["rope_type"] == "linear" and scaling["factor"] == 2.0
    assert main([*args, "--rope-scaling", "cubic", "2"]) == 2
    assert "--rope-scaling" in capsys.readouterr().err


def test_the_job_kinds_of_rope_scaling_are_those_applied():
    from terastack.training.hf.model_files import ROPE_SCALINGS
    from terastack.training.job.sections import ROPE_SCALINGS as JOB_ROPE_SCALINGS

    assert JOB_ROPE_SCALINGS == ROPE_SCALINGS


def test_errors_name_settings_as_typed_with_did_you_mean(setup, capsys):
    work = setup["work"]
    assert main([*setup["base"], "--host-budget", "lots", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--host-budget" in err and "host_budget" not in err
    assert main([*setup["base"], "--steps", "1", "host_budgt=1GiB"]) == 2
    assert "did you mean 'host_budget'?" in capsys.readouterr().err
    assert main([*setup["base"], "--steps", "1", "training.lrr=1e-3"]) == 2
    assert "did you mean 'training.lr'?" in capsys.readouterr().err
    (work / "job.yaml").write_text("trainng: {lr: 1e-3}\n")
    assert main(["finetune", "--config", "job.yaml"]) == 2
    err = capsys.readouterr().err
    assert "job.yaml" in err and "did you mean 'training'?" in err
    assert main([*setup["base"], "--steps", "1", "grad_accum=0"]) == 2
    assert "grad_accum: must be >= 1" in capsys.readouterr().err
