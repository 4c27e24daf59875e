"""Leaving a rank in order: no thread is inside a torch.distributed call when the interpreter finalizes
([Note: a thread inside the network at exit] in terastack.disdp.shutdown)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from terastack.disdp import shutdown
from terastack.disdp.control import Liveness

# A thread that keeps calling into a store (the GIL released inside every call) while the program ends.
_PROGRAM = textwrap.dedent("""
    import sys, threading
    import torch.distributed as dist
    from terastack.disdp import shutdown

    def busy():
        store = dist.HashStore()
        while True:
            store.add("beat", 1)

    def rank():
        shutdown.track(threading.Thread(target=busy, daemon=True)).start()
        raise RuntimeError("the rank's own error")

    if sys.argv[1] == "exit_rank":
        shutdown.exit_rank(rank)
    else:
        rank()
""")


def _run(how: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROGRAM, how], capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(120)
def test_a_failing_rank_with_a_thread_inside_the_network_exits_with_its_error_not_sigabrt():
    # exit_rank ends such a rank with os._exit, before finalization: nothing is left to chance, so one run tells
    out = _run("exit_rank")
    assert out.returncode == 1, (out.returncode, out.stderr[-400:])
    assert "the rank's own error" in out.stderr and "terminate called" not in out.stderr
    plain = _run("plain")   # what a rank did before: finalization under the busy thread
    # usually an abort; a loaded machine can let the thread leave the network first (a race), and then it exits 1
    assert plain.returncode in (-6, 1), (plain.returncode, plain.stderr[-400:])
    assert (plain.returncode == -6) == ("terminate called" in plain.stderr), plain.stderr[-400:]


def test_exit_rank_returns_the_entry_code_and_destroys_the_group(monkeypatch):
    destroyed = []
    monkeypatch.setattr(shutdown, "destroy_group", lambda: destroyed.append(True))
    monkeypatch.setattr(shutdown, "alive", lambda: [])   # threads of other tests in this process are not ours
    assert shutdown.exit_rank(lambda x: x + 1, 2) == 3 and destroyed == [True]
    with pytest.raises(ValueError, match="own"):
        shutdown.exit_rank(lambda: (_ for _ in ()).throw(ValueError("own")))
    assert destroyed == [True, True]


def test_liveness_close_waits_for_the_beating_thread():
    """close() returns only once the heartbeat thread has left the store (it was inside a slow add)."""
    class SlowStore:
        def __init__(self):
            self.calls = 0
            self.beating = threading.Event()

        def add(self, key, value):
            self.calls += 1
            if threading.current_thread().name.startswith("terastack-beat"):
                self.beating.set()
                time.sleep(0.3)   # a slow store: the thread is still inside add() when close() is called
            return self.calls

    store = SlowStore()
    beat = Liveness(0, 2, connect=lambda: store, beat_s=0.01)
    assert store.beating.wait(60)   # the thread is inside add()
    beat.close(timeout_s=60)
    assert not beat._thread.is_alive()
    assert beat._thread not in shutdown.alive()
    assert threading.current_thread() not in shutdown.alive()
