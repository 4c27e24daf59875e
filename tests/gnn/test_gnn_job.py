"""GNN jobs in the job system: every setting reachable by flag, file key and override; ``gnn train --config``; a
run killed with SIGKILL at a counted batch and resumed ends with the model of the run never killed, for both
graph kinds; Ctrl-C ends with one line naming the ``--resume`` command."""
from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from terastack.cli import build_parser, main
from terastack.gnn.settings import GnnJob, gnn_job
from terastack.gnn.training import train as train_module
from terastack.gnn.training.models import load_model
from terastack.gnn.training.train import GnnTrainer
from terastack.training.job import job_flags, resolve_job
from terastack.training.job.sections import flat_index, sections_of

#: a value other than the default for every GNN setting, as given and as read
VALUES = {
    "data.path": ("d", "d"), "data.verify": ("full", "full"), "data.topology": ("ssd", "ssd"),
    "data.indptr": ("memory", "memory"), "model.kind": ("gcn", "gcn"), "model.hidden": ("16", 16),
    "sampling.fanouts": ("5,-1", "5,-1"), "sampling.batch_size": ("64", 64), "sampling.replace": (True, True),
    "sampling.presample_epochs": ("1", 1), "sampling.samplers": ("3", 3), "sampling.depth": ("2", 2),
    "sampling.overlap": (False, False), "cache.device_cache": ("1MiB", 1 << 20), "cache.host_cache": ("2MiB", 2 << 20),
    "cache.device": ("cpu", "cpu"), "training.epochs": ("3", 3), "training.lr": ("0.01", 0.01),
    "training.seed": ("7", 7), "training.eval_nodes": ("-1", -1), "training.nproc": ("2", 2),
    "training.check_sync": (True, True), "training.threads": ("1", 1), "checkpoint.dir": ("ck", "ck"),
    "checkpoint.every": ("5", 5), "checkpoint.resume": ("old", "old"), "output.save_model": ("m.pt", "m.pt"),
}


def test_every_setting_is_reachable_by_flag_file_key_and_override(tmp_path):
    paths = [f"{s}.{f.name}" for s, cls in sections_of(GnnJob).items() for f in dataclasses.fields(cls)]
    assert sorted(paths) == sorted(VALUES)  # a new setting needs its row here
    flat_of = {path: flat for flat, path in flat_index(GnnJob).items()}
    parser = build_parser()
    for path, (given, expected) in VALUES.items():
        flag = "--" + flat_of[path].replace("_", "-")
        words = [flag if given is True else "--no-" + flag[2:]] if isinstance(given, bool) else [flag, given]
        by_flag = resolve_job(file=None, flags=job_flags(parser.parse_args(["gnn", "train", *words])), overrides=[],
                              job=GnnJob)
        section, name = path.split(".")
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({section: {name: expected}}))  # a file's types
        by_file = resolve_job(file=tmp_path / "job.yaml", flags={}, overrides=[], job=GnnJob)
        by_flat = resolve_job(file=None, flags={}, overrides=[f"{flat_of[path]}={given}"], job=GnnJob)
        by_path = resolve_job(file=None, flags={}, overrides=[f"{path}={given}"], job=GnnJob)
        for job in (by_flag, by_file, by_flat, by_path):
            assert job.get(path) == expected != GnnJob().get(path), path


def test_train_takes_a_job_file_and_overrides_and_names_a_bad_key(tiny, tmp_path, capsys):
    (tmp_path / "gnn.yaml").write_text(yaml.safe_dump({
        "data": {"path": str(tiny)}, "sampling": {"fanouts": [4, 3], "batch_size": 200}, "model": {"hidden": 8},
        "training": {"epochs": 1, "eval_nodes": 0}}))
    assert main(["gnn", "train", "--config", str(tmp_path / "gnn.yaml"), "--quiet", "--json", "batch_size=300",
                 "training.lr=0.01"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["config"]["sampling"]["batch_size"] == 300 and r["config"]["training"]["lr"] == 0.01
    assert r["config"]["sampling"]["fanouts"] == "4,3" and len(r["loss_curve"]) == 2  # 600 seeds, batches of 300
    (tmp_path / "bad.yaml").write_text("sampling: {batch_sise: 3}\n")
    assert main(["gnn", "train", "--config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "sampling.batch_sise" in err and "did you mean 'sampling.batch_size'" in err


#: a child that trains through the command line and is killed with SIGKILL right after its counted batch
_KILLED_CHILD = """
import os, signal, sys
import terastack.gnn.training.train as train
from terastack.cli import main
kill_at, real, count = int(sys.argv[1]), train.train_step, [0]
def step(model, optimizer, data):
    loss = real(model, optimizer, data)
    count[0] += 1
    if count[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return loss
train.train_step = step
sys.exit(main(sys.argv[2:]))
"""


def _settings(kind: str, tiny, hetero) -> dict:
    if kind == "homogeneous":  # 600 training seeds: 6 batches an epoch
        return dict(data=str(tiny), fanouts="4,3", batch_size=100, epochs=2, hidden=8, eval_nodes=64,
                    host_cache="40KiB", topology="ssd", seed=3)
    return dict(data=str(hetero), model="rgcn", fanouts="3,2", batch_size=100, epochs=2, hidden=8, eval_nodes=64,
                host_cache="96KiB", seed=3)


def _flags(settings: dict) -> list[str]:
    return [w for k, v in settings.items() for w in (f"--{k.replace('_', '-')}", str(v))]


@pytest.mark.parametrize("kind", ["homogeneous", "heterogeneous"])
def test_a_run_killed_at_a_batch_and_resumed_equals_the_run_never_killed(kind, tiny, hetero, tmp_path):
    settings = _settings(kind, tiny, hetero)
    whole = GnnTrainer(gnn_job(**settings, save_model=str(tmp_path / "whole.pt")), progress=False).run()
    ckpt = tmp_path / "ckpt"
    # checkpoints after batches 4 and 8 (the second epoch's second); killed after batch 9, before any checkpoint
    argv = ["gnn", "train", *_flags(settings), "--checkpoint", str(ckpt), "--checkpoint-every", "4", "--threads", "1",
            "--quiet"]
    child = subprocess.run([sys.executable, "-c", _KILLED_CHILD, "9", *argv], capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert (ckpt / "LATEST").is_file() and not (tmp_path / "resumed.pt").exists()
    resumed = GnnTrainer(gnn_job(**settings, resume=str(ckpt), save_model=str(tmp_path / "resumed.pt")),
                         progress=False).run()
    assert resumed["resumed_from"] == str(ckpt) and resumed["epochs"][1]["first_batch"] == 2
    assert resumed["loss_curve"] == whole["loss_curve"] and len(whole["loss_curve"]) == 12
    assert resumed["test_acc"] == whole["test_acc"]
    a, b = load_model(tmp_path / "whole.pt")[0].state_dict(), load_model(tmp_path / "resumed.pt")[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="resume: the checkpoint was written by a job with sampling.batch_size"):
        GnnTrainer(gnn_job(**{**settings, "batch_size": 50}, resume=str(ckpt)), progress=False).run()


def test_ctrl_c_ends_with_one_line_naming_the_resume_command(tiny, tmp_path, capsys, monkeypatch):
    real, count = train_module.train_step, [0]

    def step(model, optimizer, data):
        count[0] += 1
        if count[0] == 5:
            raise KeyboardInterrupt
        return real(model, optimizer, data)

    monkeypatch.setattr(train_module, "train_step", step)
    ckpt = tmp_path / "ckpt"
    argv = ["gnn", "train", "--data", str(tiny), "--fanouts", "3,2", "--batch-size", "100", "--hidden", "8",
            "--eval-nodes", "0", "--checkpoint", str(ckpt), "--checkpoint-every", "2", "--quiet"]
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted at batch 4 of epoch 0 (4 batches trained); last "
                                               f"checkpoint {ckpt} (step 4); resume with: terastack gnn train")
    command = shlex.split(err[0].split("resume with: ")[1])
    assert command[-2:] == ["--resume", str(ckpt)]
    monkeypatch.setattr(train_module, "train_step", real)
    assert main(command[1:] + ["--json"]) == 0  # the printed command goes on from batch 4
    r = json.loads(capsys.readouterr().out)
    assert r["resumed_from"] == str(ckpt) and r["epochs"][0]["first_batch"] == 4 and len(r["loss_curve"]) == 6
