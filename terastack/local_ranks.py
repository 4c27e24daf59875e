"""Ranks started on this machine by torchrun's elastic agent, as ``dist train`` and multi-process GNN training
start them: a free loopback port for the rendezvous, and the agent's per-rank log directory.

The agent makes that directory under the temporary directory on every launch and never removes it (each rank's
``error.json`` lives there), so every job would leave one behind. :func:`agent_logs` gives the launch a
directory of its own and removes it once the launch, and the reading of its failure records, is over."""
from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile


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
