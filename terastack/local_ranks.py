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
