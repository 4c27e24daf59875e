"""Warm rank starts: each rank torchrun's agent starts is a stub that a server, which imported the rank's program
once, forks the rank for. The stub must stand in for its rank exactly: the rank gets the stub's argv, environment,
working directory and streams, signals reach it, and the stub ends as the rank ended; a stub killed outright takes
its rank with it. These run the stub directly (torchrun adds nothing here; the job tests launch through it)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from terastack.local_ranks import RANK_STARTS_ENV, rank_command

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm starts are Linux's")

PROGRAM = '''
import json, os, signal, sys, time
if __name__ == "__main__":
    what = sys.argv[1]
    if what == "report":
        print(json.dumps({"name": __name__, "argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
                          "sid": os.getsid(0), "env": os.environ.get("RANK_TEST_VALUE")}), flush=True)
        sys.exit(int(sys.argv[2]))
    if what == "message":
        sys.exit("the rank's own message")
    if what == "raise":
        raise RuntimeError("the rank raised")
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "wait":
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"the rank got signal {signum}"))
        print(os.getpid(), flush=True)
        time.sleep(120)
'''


@pytest.fixture
def program(tmp_path, monkeypatch):
    (tmp_path / "rank_program_under_test.py").write_text(PROGRAM)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.delenv(RANK_STARTS_ENV, raising=False)
    return "rank_program_under_test"


def _stub(entry, argv, extra: list[str], **kw):
    return subprocess.Popen([entry, *argv, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_the_rank_gets_the_stubs_argv_environment_directory_and_streams_and_its_exit_code(program, tmp_path):
    where = tmp_path / "elsewhere"
    where.mkdir()
    with rank_command(program, ["report"]) as (entry, argv):
        assert argv[:3] == ["-I", "-S", argv[2]] and argv[-3:] == ["-m", program, "report"]
        stub = _stub(entry, argv, ["3"], cwd=where, env={**os.environ, "RANK_TEST_VALUE": "only the stub's"})
        out, err = stub.communicate(timeout=60)
    assert stub.returncode == 3, err
    seen = json.loads(out)
    assert seen["name"] == "__main__" and seen["argv"] == ["report", "3"]
    assert seen["cwd"] == str(where) and seen["env"] == "only the stub's"
    assert seen["pid"] != stub.pid and seen["sid"] == seen["pid"]   # a process of its own, in a session of its own


@pytest.mark.parametrize("what, code, said", [("message", 1, "the rank's own message"),
                                              ("raise", 1, "RuntimeError: the rank raised"),
                                              ("kill", -signal.SIGKILL, "")])
def test_the_stub_ends_as_its_rank_ended(program, what, code, said):
    with rank_command(program, [what]) as (entry, argv):
        stub = _stub(entry, argv, [])
        _, err = stub.communicate(timeout=60)
    assert stub.returncode == code, err
    assert said in err


def test_a_signal_sent_to_the_stub_reaches_its_rank(program):
    with rank_command(program, ["wait"]) as (entry, argv):
        stub = _stub(entry, argv, [])
        rank = int(stub.stdout.readline())
        stub.send_signal(signal.SIGTERM)
        _, err = stub.communicate(timeout=60)
    assert stub.returncode == 1 and f"the rank got signal {int(signal.SIGTERM)}" in err, err
    assert not _alive(rank)


def test_a_stub_killed_outright_takes_its_rank_with_it(program):
    with rank_command(program, ["wait"]) as (entry, argv):
        stub = _stub(entry, argv, [])
        rank = int(stub.stdout.readline())
        stub.kill()
        stub.wait(timeout=60)
        deadline = time.monotonic() + 60   # an upper bound only: the rank sees its connection close at once
        while _alive(rank) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(rank)


def test_a_stub_whose_server_has_ended_says_so(program):
    with rank_command(program, ["report", "0"]) as (entry, argv):
        pass
    stub = _stub(entry, argv, [])
    _, err = stub.communicate(timeout=60)
    assert stub.returncode == 1 and "has ended; no rank was started" in err, err


def test_cold_starts_are_a_fresh_interpreter_per_rank(program, monkeypatch):
    monkeypatch.setenv(RANK_STARTS_ENV, "cold")
    with rank_command(program, ["report"]) as (entry, argv):
        assert (entry, argv) == (sys.executable, ["-m", program, "report"])
        stub = _stub(entry, argv, ["0"])
        out, _ = stub.communicate(timeout=60)
    assert stub.returncode == 0 and json.loads(out)["pid"] == stub.pid


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: it only waits for the server to read its status)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_jobs_warm_start_imports_its_models_family(tmp_path):
    """``dist train`` has its ranks' server import transformers and the model's family once for every rank; the
    family is read from the job's model without importing transformers, and a module name that does not exist
    would only start nothing warm, so each one named must exist."""
    import dataclasses
    import importlib.util

    from terastack.disdp.job_run import rank_imports
    from terastack.training.job import JobConfig
    from terastack.training.model_registry import model_type_of

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert model_type_of("tiny-llama") == "llama" and model_type_of("opt-125m") == "opt"
    assert model_type_of(str(tmp_path)) == "qwen2" == model_type_of(str(tmp_path / "config.json"))
    assert model_type_of("org/name") is None and model_type_of(str(tmp_path / "missing.json")) is None
    job = JobConfig()
    for path, family in ((None, "llama"), (str(tmp_path), "qwen2")):
        names = rank_imports(dataclasses.replace(job, model=dataclasses.replace(job.model, path=path)))
        assert names[0] == "terastack.disdp.job_run" and f"transformers.models.{family}.modeling_{family}" in names
        assert all(importlib.util.find_spec(name) is not None for name in names), names
