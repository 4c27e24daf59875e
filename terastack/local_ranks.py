"""Ranks started on this machine by torchrun's elastic agent, as ``dist train`` and multi-process GNN training
start them: a free loopback port for the rendezvous, the agent's per-rank log directory, and the program each rank
runs (:func:`rank_command`: warm, forked from one import, or a fresh interpreter per rank).

The agent makes that directory under the temporary directory on every launch and never removes it (each rank's
``error.json`` lives there), so every job would leave one behind. :func:`agent_logs` gives the launch a
directory of its own and removes it once the launch, and the reading of its failure records, is over."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

#: "cold" starts every rank as a fresh interpreter; anything else (the default) starts them warm on Linux
RANK_STARTS_ENV = "TERASTACK_RANK_STARTS"
#: the stand-in torchrun's agent starts for each warm rank (run by path with ``python -I -S``: no imports of ours)
RANK_STUB = str(Path(__file__).with_name("rank_stub.py"))


def launch_config(nproc: int, *, name: str, timeout_s: float, logs):
    """torchrun's ``LaunchConfig`` for ``nproc`` ranks of this machine: a loopback rendezvous on a free port, no
    restarts, spawned ranks, the agent's logs in ``logs`` (from :func:`agent_logs`)."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"{name}-{uuid.uuid4().hex[:8]}",
                        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", local_addr="127.0.0.1",
                        rdzv_configs={"timeout": int(timeout_s)}, max_restarts=0, monitor_interval=0.1,
                        start_method="spawn", shutdown_timeout=2, logs_specs=logs)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def agent_logs():
    """The ``logs_specs`` of one launch (``LaunchConfig(logs_specs=...)``); read failures inside the block."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    log_dir = tempfile.mkdtemp(prefix="terastack-ranks-")
    try:
        yield DefaultLogsSpecs(log_dir=log_dir)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def warm_starts() -> bool:
    """Whether ranks start warm (:mod:`terastack.rank_server`): on Linux unless ``TERASTACK_RANK_STARTS=cold``."""
    return sys.platform.startswith("linux") and os.environ.get(RANK_STARTS_ENV, "warm") != "cold"


@contextlib.contextmanager
def rank_command(module: str, args: list[str], *, preload: tuple[str, ...] = (), warm: bool = True):
    """The program torchrun's agent starts for every rank of ``python -m MODULE ARGS...``, as ``(entrypoint,
    arguments)`` for ``elastic_launch(config, entrypoint)(*arguments)``; launch inside the block.

    Warm ([Note: a warm rank is the rank torchrun started] in :mod:`terastack.rank_server`): a server started here
    imports MODULE and ``preload`` (what MODULE imports only once it runs) once, and each rank is a stub that the
    server forks a rank for. Cold (``warm`` False, or :func:`warm_starts` says no): a fresh interpreter per rank."""
    if not (warm and warm_starts()):
        yield sys.executable, ["-m", module, *args]
        return
    import uuid

    name = f"terastack-ranks-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind("\0" + name)
        listener.listen(64)   # before torchrun starts a stub: a stub that is refused knows the server has ended
        server = subprocess.Popen([sys.executable, "-m", "terastack.rank_server", str(listener.fileno()), module,
                                   *preload], stdin=subprocess.PIPE, start_new_session=True,
                                  pass_fds=[listener.fileno()])
    try:
        yield sys.executable, ["-I", "-S", RANK_STUB, name, "-m", module, *args]
    finally:
        server.stdin.close()   # the server's cue to end; every rank has ended by now
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
