"""A job's default store is removed on every exit it sees; one left by a killed job is removed by the next."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import pytest

from terastack.training.scratch_store import ScratchStore, process_start
from terastack.units import format_bytes

PREFIX = "terastack-test-"

CHILD = """
import sys
from terastack.training.scratch_store import ScratchStore
with ScratchStore(prefix=sys.argv[2], root=sys.argv[1]) as d:
    (d / "state.bin").write_bytes(bytes(3000))
    print(d, flush=True)
    if sys.argv[3] == "wait":
        sys.stdin.readline()
    else:
        raise {exit}
"""


def _child(root, *, mode="wait", exit="SystemExit(3)"):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", CHILD.format(exit=exit), str(root), PREFIX, mode],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return p, p.stdout.readline().strip()   # the child's store, once made: an event, not a sleep


def test_store_of_a_killed_job_is_removed_by_the_next_one_line_each(tmp_path):
    alive, alive_store = _child(tmp_path)
    killed, store = _child(tmp_path)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    try:
        assert os.path.isdir(store) and os.path.isdir(alive_store)
        log = io.StringIO()
        with ScratchStore(prefix=PREFIX, root=tmp_path, log=log) as mine:
            assert mine.is_dir() and mine.name.startswith(f"{PREFIX}{os.getpid()}-")
            lines = log.getvalue().splitlines()
            assert lines == [f"removed {store}, the default store of a job that no longer runs "
                             f"(pid {killed.pid}): {format_bytes(3000)} freed"]
            assert not os.path.exists(store)
            assert os.path.isdir(alive_store)   # a running job's store is its own
        assert not mine.exists()
    finally:
        alive.stdin.close()
        alive.wait()
    assert not os.path.exists(alive_store)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_reused_pid_is_not_taken_for_the_owner(tmp_path):
    """A store named with a running pid but another start time was made by a process that has ended."""
    stale = tmp_path / f"{PREFIX}{os.getpid()}-{process_start(os.getpid()) + 1}-abc"
    stale.mkdir()
    other = tmp_path / "terastack-testx" / "keep"   # not of this prefix
    other.mkdir(parents=True)
    unowned = tmp_path / f"{PREFIX}abc123"    # no owner in its name: left alone
    unowned.mkdir()
    log = io.StringIO()
    with ScratchStore(prefix=PREFIX, root=tmp_path, log=log):
        assert not stale.exists() and other.exists() and unowned.exists()
    assert f"(pid {os.getpid()}): 0 B freed" in log.getvalue()


@pytest.mark.parametrize("exit", ["SystemExit(3)", "KeyboardInterrupt()", "RuntimeError('boom')"])
def test_every_exit_the_job_sees_removes_its_store(tmp_path, exit):
    p, store = _child(tmp_path, mode="raise", exit=exit)
    p.communicate()
    assert p.returncode != 0
    assert store and not os.path.exists(store)
    assert list(tmp_path.iterdir()) == []


def test_close_is_idempotent_and_open_returns_the_same_directory(tmp_path):
    s = ScratchStore(prefix=PREFIX, root=tmp_path)
    d = s.open()
    assert s.open() == d
    s.close()
    s.close()
    assert not d.exists()
    with pytest.raises(ValueError, match="prefix"):
        ScratchStore(prefix="run-7")


def test_finetune_without_store_removes_a_stale_default_store_and_its_own(tmp_path, monkeypatch, capsys):
    """``terastack finetune`` with no ``--store``: a default store left by a job that no longer runs (here: this
    pid with another start time, as after a reuse of the pid) goes first, in one line; its own goes at the end."""
    import tempfile

    from terastack.cli import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / f"terastack-finetune-{os.getpid()}-{process_start(os.getpid()) + 1}-abcd1234"
    (stale / "run-0").mkdir(parents=True)
    (stale / "run-0" / "state.bin").write_bytes(bytes(5000))
    assert main(["finetune", "--steps", "1", "--seq-len", "32", "offload.calibrate=false"]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("removed ")] == [
        f"removed {stale}, the default store of a job that no longer runs (pid {os.getpid()}): "
        f"{format_bytes(5000)} freed"]
    assert not list(tmp_path.glob("terastack-finetune-*"))


TERMINATED_CHILD = """
import sys
from terastack.training.interrupt import terminate_as_exit
from terastack.training.scratch_store import ScratchStore
with terminate_as_exit(), ScratchStore(prefix=sys.argv[2], root=sys.argv[1]) as d:
    print(d, flush=True)
    sys.stdin.readline()
"""


def test_sigterm_under_terminate_as_exit_removes_the_store(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", TERMINATED_CHILD, str(tmp_path), PREFIX], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    store = p.stdout.readline().strip()
    assert os.path.isdir(store)
    p.send_signal(signal.SIGTERM)
    p.wait()
    p.stdin.close()
    assert p.returncode == 143
    assert not os.path.exists(store) and list(tmp_path.iterdir()) == []
