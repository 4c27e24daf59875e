"""One job writes an ``--output`` directory at a time: a second refuses in one line naming the first, before it
trains; the lock is released on every way out, ``kill -9`` included."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from terastack.cli import main
from terastack.training.output_dir import OutputDir, OutputInUse

HOLDER = """
import sys
from terastack.training.output_dir import OutputDir
out = OutputDir(sys.argv[1])
print("locked", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def holder(tmp_path):
    """A real process holding ``tmp_path/out`` (ended by SIGKILL at the end of the test if still running)."""
    procs = []

    def start(out):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"   # an event, not a sleep
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_second_job_refuses_naming_the_first(tmp_path, holder):
    out = tmp_path / "out"
    first = holder(out)
    with pytest.raises(OutputInUse) as info:
        OutputDir(out)
    msg = str(info.value)
    assert "\n" not in msg and f"--output {out}: another job is writing it (pid {first.pid}, started " in msg
    assert "-c " in msg   # the first job's command
    first.stdin.close()   # it ends in order: its lock file is gone and the output is free
    assert first.wait() == 0
    assert not (tmp_path / ".out.lock").exists()
    OutputDir(out).close()


def test_lock_of_a_killed_job_is_taken_over_with_a_note(tmp_path, holder, capsys):
    out = tmp_path / "out"
    first = holder(out)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (tmp_path / ".out.lock").exists()   # left behind, but no longer locked
    with OutputDir(out):
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"--output {out}: taking over the lock left by a job that no longer runs (pid {first.pid}" in err
        with pytest.raises(OutputInUse, match=f"pid {os.getpid()}"):
            OutputDir(out)   # this job holds it now
    assert not (tmp_path / ".out.lock").exists()


def test_released_on_every_exit_of_this_process(tmp_path):
    out = tmp_path / "out"

    def failing_job():
        OutputDir(out)
        raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError):
        failing_job()
    OutputDir(out).close()   # the failed job's lock went with it


def test_finetune_refuses_a_busy_output_before_training(tmp_path, holder, capsys):
    out = tmp_path / "out"
    first = holder(out)
    assert main(["finetune", "--steps", "1", "--store", str(tmp_path / "store"), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"another job is writing it (pid {first.pid}" in lines[0], err
    assert not (tmp_path / "out.partial").exists() and not (tmp_path / "out").exists()
