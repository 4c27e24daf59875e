"""Ranks started on this machine by torchrun's elastic agent, as ``dist train`` and multi-process GNN training
start them: a free loopback port for the rendezvous, and the agent's per-rank log directory.

The agent makes that directory under the temporary directory on every launch and never removes it (each rank's
``error.json`` lives there), so every job would leave one behind. :func:`agent_logs` gives the launch a
directory of its own and removes it once the launch, and the reading of its failure records, is over."""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import socket
import sys
import tempfile


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


def end_rank_process(code: int) -> None:
    """End a rank's process with ``code`` once its work is done, without the interpreter's teardown.

    [Note: a rank leaves without teardown]
    After a rank's last line, CPython tears down every module and object it loaded; with torch and transformers
    that is about a second of CPU a rank. The ranks of one machine share its cores, so the teardowns queue: a job
    of 7 ranks on 2 cores spent 3.8 s between its ranks' exit handlers and their ends, and the launcher waits
    for all of them. Nothing a finished rank holds needs the teardown -- its files are closed by the code that
    wrote them, the process group is destroyed -- so a rank flushes its streams and logs, runs the exit handlers
    (torch's and the user's), and ends. A rank that fails raises instead, and ends as any Python program does."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
