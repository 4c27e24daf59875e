"""What `terastack finetune` refuses before it starts, in one line and with nothing lost: a batch the budgets
cannot hold (before any of it exists), an output that is or holds what the job reads, a path it could not write,
a disk too small for its export, a missing library a setting needs, a local model path that does not exist."""
import hashlib
import re
import sys

import pytest

from terastack.cli import main

from .test_finetune_frictions import _byte_model, _text


@pytest.fixture
def job(tmp_path, hardware_file, capsys, monkeypatch):
    """A tiny byte-vocabulary model and a text file in tmp_path (the working directory); the job's flags."""
    monkeypatch.chdir(tmp_path)
    _byte_model(tmp_path / "model")
    _text(tmp_path / "train.txt", 400)
    capsys.readouterr()
    return ["finetune", "--model", "model", "--data", "train.txt", "--steps", "1", "--seq-len", "16",
            "--batch-size", "2", "--hardware", hardware_file, "--device-budget", "64MiB", "--host-budget", "64MiB",
            "--store", str(tmp_path / "store"), "--no-calibrate"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _digest(path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())).hexdigest()


def test_a_batch_the_budgets_cannot_hold_is_refused_before_it_exists(job, capsys, monkeypatch):
    """The issue's case at a tiny scale: a wide batch with calibration on (which runs units at the batch's shape)
    is refused by the plan, naming the budget and the shortfall, before calibration or anything of the batch's
    size runs: the process grows by a small part of what it refuses."""
    from terastack.llm.engine import profile
    from terastack.memory import PeakRSS

    def never(*args, **kwargs):
        raise AssertionError("a unit was timed at a batch the plan refuses")

    monkeypatch.setattr(profile, "_time_unit", never)
    wide = [*job, "--batch-size", "8192", "--seq-len", "64", "--calibrate"]
    with PeakRSS() as rss:
        assert main(wide) == 2
    line = _one_line(capsys)
    assert "device budget exceeded" in line and "short by" in line, line
    needed = re.search(r"needs ([\d.]+ \w+)", line).group(1)
    value, unit = needed.split()
    needed_bytes = float(value) * {"MiB": 2**20, "GiB": 2**30}[unit]
    assert needed_bytes > 1 << 30  # the batch's activations, logits, loss and data
    if rss.reset_ok:
        assert rss.peak_bytes < needed_bytes / 8, (rss.peak_bytes, needed)
    # the same job at a batch that fits trains (its data is priced too, and fits)
    assert main(job) == 0


@pytest.mark.parametrize("case", ["same", "symlink", "holds-model", "adapter"])
def test_an_output_that_is_what_the_job_reads_is_refused_before_anything_is_written(job, tmp_path, capsys, case):
    model = tmp_path / "model"
    before = _digest(model)
    argv = {"same": [*job, "--output", "model"],
            "symlink": [*job, "--output", "link"],
            "holds-model": [*job, "--output", str(tmp_path)],
            "adapter": [*job, "--lora", "2", "--lora-init-from", "model/../model", "--output", "./model"]}[case]
    (tmp_path / "link").symlink_to(model)
    assert main(argv) == 2
    line = _one_line(capsys)
    assert line.startswith("terastack finetune: error: ValueError: --output") and "--model" in line, line
    assert ("holds" if case == "holds-model" else "is also") in line
    assert _digest(model) == before
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob(".*.lock"))


@pytest.mark.parametrize("flag", ["--checkpoint", "--metrics", "--output", "--trace"])
def test_a_path_the_job_cannot_write_is_refused_before_the_engine(job, tmp_path, capsys, flag):
    (tmp_path / "a-file").write_text("not a directory")
    assert main([*job, flag, "a-file/sub"]) == 2
    line = _one_line(capsys)  # nothing before it: no engine built, no step taken
    assert f"{flag} a-file/sub: cannot be written" in line and "is not a directory" in line, line


def test_a_full_disk_under_the_output_is_refused_before_training(job, tmp_path, capsys, monkeypatch):
    from terastack import disk_room

    (tmp_path / "disk").mkdir()
    real = disk_room.free_bytes
    monkeypatch.setattr(disk_room, "free_bytes",
                        lambda p: 1 << 20 if str(p).startswith(str(tmp_path / "disk")) else real(p))
    assert main([*job, "--output", "disk/out"]) == 2
    err = capsys.readouterr().err
    assert "1/1 step" not in err  # refused before the first step
    line = err.strip().splitlines()[-1]
    assert "--output disk/out: needs" in line and "1.00 MiB (1048576 bytes) free" in line, line
    exported = int(re.search(r"needs [\d.]+ \w+ \((\d+) bytes\)", line).group(1))
    assert exported > 16 << 20  # the weights in float32 beside the room for config, job file and metrics
    assert not (tmp_path / "disk" / "out").exists()


def test_a_missing_low_bit_library_is_one_line(job, capsys, monkeypatch):
    for name in ("bitsandbytes", "bitsandbytes.functional"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as when it is not installed
    assert main([*job, "--optimizer", "adamw8bit"]) == 2
    line = _one_line(capsys)
    assert "adamw8bit: needs bitsandbytes" in line and "pip install 'terastack[lowbit]'" in line, line


def test_a_mistyped_local_model_path_is_a_missing_directory_not_a_hub_id(job, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "models").mkdir()
    argv = [*job]
    argv[argv.index("--model") + 1] = "models/copy"
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "models/copy does not exist" in line and "downloadable" not in line, line


def test_the_profile_counts_the_same_whether_unit_outputs_are_allocated_or_broadcast(monkeypatch):
    """Past a bounded total the profile pass hands units broadcast zeros (so a batch it will refuse is never
    allocated); what it records of each unit is the same as with allocated ones."""
    import torch

    from terastack.llm.engine import profile

    from .llm_helpers import tiny_config

    def units(limit):
        monkeypatch.setattr(profile, "_MATERIALIZE_LIMIT", limit)
        p = profile.profile_config(tiny_config("llama"), batch=2, seq_len=16, dtype=torch.float32, name="tiny")
        return [(u.act_bytes, u.boundary_bytes, u.out_bytes, u.act_tensors, u.fwd_flops, u.bwd_flops)
                for u in p.units]

    allocated, broadcast = units(1 << 30), units(0)
    assert allocated == broadcast and all(boundary > 0 for _, boundary, *_ in allocated[1:])


@pytest.mark.parametrize("command", [["finetune"], ["plan", "llm"]])
@pytest.mark.parametrize("flag, value", [("--seq-len", "0"), ("--batch-size", "0"), ("--seq-len", "-5"),
                                         ("--lora", "0")])
def test_a_bad_shape_or_rank_is_one_line_naming_its_flag(command, flag, value, capsys):
    """Both commands read the same job: a bad value is refused by its flag before anything is built (plan llm
    once raised an IndexError, torch's errors, or planned --lora 0 as a full fine-tune)."""
    assert main([*command, flag, value]) == 2
    line = _one_line(capsys)
    assert f"SettingError: {flag}: must be >= 1, got {value}" in line, line
