"""The 3B runs' scripts in benchmarks/ at tiny size: the same code path end to end, in seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    # the environment as the test has it: the test's own cache (its probe, the units' calibrated times)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(4 << 20)}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, env=env, timeout=600)


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_checkpoint_resume_script_continues_exactly(tmp_path, cached_probe):
    """Run A, killed with SIGKILL inside step 3 while its checkpoint follows the steps beside the store (the state
    on the SSD, as the 3.4B model's is), resumes as run B, which finishes step 3 to the loss and parameters of
    run R, never killed; the checkpoint copies none of the state and holds beyond the store (measured on the file
    system) a share of it; the stores and the checkpoint are gone afterwards. The runs are forks of the script's
    process (``--fork``: no interpreter to start and import into again; the test below starts new ones)."""
    proc = _run("llm-3b-checkpoint-resume.py", str(tmp_path / "run"), "--model", "tiny-llama", "--layers", "4",
                "--steps", "3", "--state-placement", "ssd", "--fork")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = _last_json(proc.stdout)
    assert r["layers"] == 4 and len(r["a_losses"]) == 2 and len(r["r_losses"]) == 3
    assert r["r_losses"][2] < r["r_losses"][0] and r["a_losses_equal_reference"]
    assert r["b_resumed_inside_step"] == 3 and 0.5 <= r["killed_at_share"] < 1
    assert r["b_loss"] == r["r_losses"][2] and r["resumed_loss_equal"] and r["resumed_parameters_equal"]
    assert r["beside_store"] and r["checkpoint_bytes"] < 1 << 20  # references, not a copy of 12 bytes a parameter
    state = 12 * r["parameters"]
    assert r["state_bytes"] == state
    assert r["points_written"] >= 3  # step 2's inside points and end, and step 3's up to the kill
    # the pinned versions of what was updated since the last point, and the extents they left free in the
    # store's files until later writes take them: a share of the state, not the state again
    assert 0 < r["checkpoint_held_bytes"] <= r["checkpoint_extra_bytes"] < state
    assert r["peak_rss_within_4gib"]
    assert not any((tmp_path / "run").iterdir())


def test_checkpoint_resume_script_copies_the_state_when_asked(tmp_path):
    proc = _run("llm-3b-checkpoint-resume.py", str(tmp_path / "run"), "--model", "tiny-llama", "--layers", "1",
                "--steps", "2", "--copy")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = _last_json(proc.stdout)
    assert r["resumed_loss_equal"] and r["resumed_parameters_equal"] and not r["beside_store"]
    assert r["checkpoint_bytes"] >= 12 * r["parameters"]  # fp32 masters and both moments
    assert r["checkpoint_extra_bytes"] >= 12 * r["parameters"]
    assert not any((tmp_path / "run").iterdir())


def test_checkpoint_resume_script_refuses_a_disk_too_small(tmp_path, monkeypatch, capsys):
    """The script's own main() in this process (no interpreter to start), its directory's free space set to 1 GiB
    less than it needs for the 3.4B model (26 layers): it refuses before starting a run, naming both numbers."""
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location("llm_3b_checkpoint_resume",
                                                  ROOT / "benchmarks" / "llm-3b-checkpoint-resume.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    params = script._parameters(script.hf_config("openllama-3b"))
    need = int(1.25 * 12 * params) + (2 << 30)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=need - (1 << 30)))
    monkeypatch.setattr(sys, "argv", ["llm-3b-checkpoint-resume.py", str(tmp_path / "run")])
    monkeypatch.setattr(script.subprocess, "run", None)  # a run started instead of the refusal fails loudly
    assert script.main() == 2
    err = capsys.readouterr().err
    assert "needs" in err and "free in" in err and "--layers" in err
    assert f"{params:,} parameters" in err and script.format_bytes(need) in err


def test_export_check_script_checks_its_export(tmp_path):
    proc = _run("llm-3b-export-check.py", str(tmp_path / "run"), "2", "tiny-llama")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = _last_json(proc.stdout)
    assert len(r["losses"]) == 2 and r["losses"][1] < r["losses"][0]
    assert r["checked_tensors"] and "config.json" in r["export_files"]
    assert r["peak_rss_within_4gib"]


def test_overhead_phases_script_reports_both_systems(tmp_path):
    proc = _run("llm-overhead-phases.py", "--model", "tiny", "--steps", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = _last_json(proc.stdout)
    assert set(r["median_ms"]["in_memory"]) == {"forward", "backward", "adamw", "step"}
    assert {"forward", "backward", "adamw", "step"} <= set(r["median_ms"]["terastack"])
    assert r["median_ms"]["terastack"]["adamw"] > 0  # the inline updates ran inside backward
    assert r["step_ratio"] > 0
