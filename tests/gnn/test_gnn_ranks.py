"""`terastack gnn train --nproc 2`: two ranks on gloo, each training on its share of every batch's seeds, keep
identical parameters after every step, reach the single process's accuracy with the same global batch, and a rank
that fails ends the job with one line naming it."""
from __future__ import annotations

import json

import pytest

from terastack.cli import main
from terastack.gnn.settings import gnn_job
from terastack.gnn.training.multi_process import run_training


def test_two_ranks_heterogeneous(hetero):
    common = dict(data=str(hetero), model="rgcn", fanouts="4,3", batch_size=100, epochs=2, hidden=16, eval_nodes=-1,
                  host_cache="128KiB", topology="ssd")
    one = run_training(gnn_job(**common), progress=False)
    two = run_training(gnn_job(**common, check_sync=True, nproc=2), progress=False)
    assert two["ranks"]["world_size"] == 2
    # every step of both epochs was checked, and no parameter differed between the ranks
    assert two["ranks"]["steps_checked"] == 2 * (600 // 100) and two["ranks"]["max_param_diff"] == 0.0
    assert len(two["loss_curve"]) == len(one["loss_curve"])  # the same global batches...
    assert one["epochs"][0]["seeds"] == 600 and two["epochs"][0]["seeds"] == 300  # ...half the seeds per rank
    assert abs(two["test_acc"] - one["test_acc"]) <= 0.02 and abs(two["val_acc"] - one["val_acc"]) <= 0.02
    assert one["ranks"] == {"world_size": 1}


def test_two_ranks_homogeneous_from_the_command_line(tiny, capsys):
    argv = ["gnn", "train", "--data", str(tiny), "--fanouts", "5,3", "--batch-size", "100", "--epochs", "2",
            "--hidden", "16", "--eval-nodes", "-1", "--json", "--quiet"]
    assert main(argv) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(argv + ["--nproc", "2", "--check-sync"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["ranks"]["world_size"] == 2 and one["ranks"]["world_size"] == 1
    assert two["ranks"]["steps_checked"] == 2 * 6 and two["ranks"]["max_param_diff"] == 0.0
    assert len(two["loss_curve"]) == len(one["loss_curve"]) == 2 * 6
    assert one["epochs"][0]["seeds"] == 600 and two["epochs"][0]["seeds"] == 300
    assert abs(two["test_acc"] - one["test_acc"]) <= 0.02, (one["test_acc"], two["test_acc"])


def test_a_failing_rank_ends_the_job_naming_it(hetero, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    # only rank 0 saves the model: it fails, the other rank is stopped, one line names rank 0
    code = main(["gnn", "train", "--data", str(hetero), "--model", "rgcn", "--fanouts", "2", "--batch-size", "300",
                 "--epochs", "1", "--hidden", "4", "--eval-nodes", "0", "--save-model", str(blocker / "m.pt"),
                 "--nproc", "2", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "RankFailed: rank 0 failed:" in err[0] and "file" in err[0]


def test_nproc_is_checked(hetero):
    with pytest.raises(ValueError, match="nproc"):
        gnn_job(data=str(hetero), nproc=0)
