"""Ctrl-C on ``terastack dist train`` (SIGINT to the whole process group, as a terminal sends it): every rank
leaves in order, and the command exits 130 with one line naming the last checkpoint and the resume command."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="the job's model is a transformers Llama")

from terastack.training.interrupt import interrupted_line, latest_checkpoint, resume_command  # noqa: E402

from .job_helpers import write_chat_job  # noqa: E402

STEPS = 100000


@pytest.mark.timeout(300)
def test_ctrl_c_stops_every_rank_and_says_how_to_resume(tmp_path):
    job = write_chat_job(tmp_path, workers=1, steps=STEPS)
    ckpt = tmp_path / "ckpt"
    argv = ["dist", "train", "--config", job, "--checkpoint", str(ckpt), "--checkpoint-every", "1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-m", "terastack", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, start_new_session=True)
    try:
        before = []
        for line in p.stderr:   # the event: a progress line past step 1 (so step 1's checkpoint is written)
            before.append(line)
            m = re.search(rf"(\d+)/{STEPS} step", line)
            if m and int(m.group(1)) >= 2:
                break
        else:
            pytest.fail("the job ended before it reported a step: " + "".join(before))
        os.killpg(p.pid, signal.SIGINT)   # the launcher and every rank, as a terminal's Ctrl-C
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, err
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)   # no rank outlived the command
    lines = [line for line in err.splitlines() if not re.search(rf"\d+/{STEPS} step", line)]
    assert "Traceback" not in err and "forcefully" not in err, err
    step = json.loads((ckpt / "LATEST").read_text())["step"]
    assert step >= 1
    assert lines == [f"interrupted; last checkpoint {ckpt} (step {step}); resume with: terastack "
                     + " ".join(argv) + f" --resume {ckpt}"], err


def test_interrupted_line_and_resume_command(tmp_path):
    assert resume_command(["dist", "train", "--resume", "old", "resume=x", "--config", "j.yaml"], "ck",
                          command=("dist", "train")) == "terastack dist train --config j.yaml --resume ck"
    assert resume_command(None, "ck", command=("dist", "train")) == "terastack dist train --resume ck"
    assert latest_checkpoint(str(tmp_path)) is None and latest_checkpoint(None) is None
    (tmp_path / "LATEST").write_text(json.dumps({"checkpoint": "step-00000004", "step": 4}))
    last = latest_checkpoint(str(tmp_path))
    assert (last.path, last.step) == (str(tmp_path), 4)
    assert interrupted_line(step=None, total=None, where="", last=last, argv=["finetune"]) == (
        f"interrupted; last checkpoint {tmp_path} (step 4); resume with: terastack finetune --resume {tmp_path}")
    assert interrupted_line(step=3, total=10, last=None, argv=None, checkpoint_dir="c") == (
        "interrupted at step 3 of 10; no checkpoint to resume from (none was written to c yet)")
    assert interrupted_line(step=None, total=None, last=None, argv=None) == (
        "interrupted before training started; no checkpoint to resume from (--checkpoint DIR --checkpoint-every N "
        "keeps one)")


@pytest.fixture
def sigint_handler_kept():
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


def test_rank_zero_raises_a_noted_sigint_once_at_the_next_stop_point(sigint_handler_kept):
    from terastack.disdp.shutdown import defer_interrupts, follow_interrupts, stop_point

    defer_interrupts()
    stop_point()                        # nothing noted: nothing raised
    signal.raise_signal(signal.SIGINT)  # noted, not raised here
    with pytest.raises(KeyboardInterrupt):
        stop_point()
    signal.raise_signal(signal.SIGINT)
    stop_point()                        # once: the stop that follows is not interrupted again
    defer_interrupts([signal.SIGINT])   # one noted before the job's modules were imported (job_rank)
    with pytest.raises(KeyboardInterrupt):
        stop_point()
    follow_interrupts()
    signal.raise_signal(signal.SIGINT)  # every other rank ignores it
