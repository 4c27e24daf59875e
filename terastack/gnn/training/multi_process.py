"""``terastack gnn train --nproc N``: the ranks of a data-parallel job, started on this machine or found under torchrun.

:func:`run_training` is the one entry: under an outer ``torchrun`` (``RANK`` and ``WORLD_SIZE`` > 1 in the
environment) this process is one rank and trains as such; with ``nproc`` > 1 it starts ``nproc`` ranks under
torchrun's elastic agent (c10d rendezvous on loopback, every wait bounded by ``timeout_s``), each running
``python -m terastack.gnn.training.multi_process JOB.json``, and returns rank 0's result; otherwise it trains in this
process. A rank that fails ends the job: torchrun stops the others and the error is one line naming the first
rank that failed and its last error line. See terastack.gnn.training.data_parallel [Note: data-parallel GNN training].
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from terastack.atomic import atomic_write_json
from terastack.gnn.settings import GnnJob
from terastack.gnn.training.train import GnnTrainer
from terastack.local_ranks import agent_logs, launch_config, rank_command

RESULT = "result.json"


class RankFailed(RuntimeError):
    """A rank of a data-parallel job failed; the message names the first one."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def run_training(job: GnnJob, *, timeout_s: float = 600.0, progress: bool = True,
                 argv: list[str] | None = None) -> dict | None:
    """Train ``job`` (either graph kind) in one process, as a torchrun rank, or on ``job.training.nproc`` ranks
    started here; returns the result (None on ranks other than 0 under an outer torchrun)."""
    if under_torchrun():
        return _as_rank(job, timeout_s, progress=progress and dist_rank() == 0)
    if job.training.nproc == 1:
        return GnnTrainer(job, progress=progress, argv=argv).run()
    return _launch(job, timeout_s, progress)


def _as_rank(job: GnnJob, timeout_s: float, *, progress: bool) -> dict | None:
    import torch
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        cuda = torch.cuda.is_available() and job.cache.device != "cpu"
        local, per_node = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if cuda:
            torch.cuda.set_device(local % torch.cuda.device_count())
        # NCCL needs a GPU per rank; ranks that share one all-reduce through gloo
        nccl = cuda and torch.cuda.device_count() >= per_node
        dist.init_process_group("nccl" if nccl else "gloo", timeout=timedelta(seconds=timeout_s))
    try:
        result = GnnTrainer(job, progress=progress).run()
        dist.barrier()  # every rank done before any leaves the group
    finally:
        if owned:
            dist.destroy_process_group()
    return result if dist_rank() == 0 else None


def dist_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _launch(job: GnnJob, timeout_s: float, progress: bool) -> dict:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    run_dir = Path(tempfile.mkdtemp(prefix="terastack-gnn-ranks-"))
    try:
        path = atomic_write_json(run_dir / "job.json", {"job": job.to_dict(everything=True), "timeout_s": timeout_s,
                                                        "progress": progress})
        with agent_logs() as logs, rank_command(__name__, [str(path)]) as (entrypoint, rank_args):
            # failure records are read inside: the directory goes after
            launch = launch_config(job.training.nproc, name="terastack-gnn", timeout_s=timeout_s, logs=logs)
            try:
                elastic_launch(launch, entrypoint)(*rank_args)
            except ChildFailedError as exc:
                raise RankFailed(describe_failures(exc.failures)) from None
        return json.loads((run_dir / RESULT).read_text())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def describe_failures(failures: dict) -> str:
    """One line from torchrun's per-rank failure records: the first rank that raised (or died), and how."""
    def how(f) -> tuple[int, str]:
        message = getattr(f, "message", "")
        if isinstance(message, dict):
            message = message.get("message", "")
        message = str(message or "").strip()
        if message and not message.startswith("Signal "):
            return 0, f"failed: {message.splitlines()[-1]}"
        if f.exitcode is not None and f.exitcode < 0:
            try:
                name = signal.Signals(-f.exitcode).name
            except ValueError:
                name = f"signal {-f.exitcode}"
            return (2 if name == "SIGTERM" else 1), f"died ({name})"
        return 0, f"failed (exit code {f.exitcode})"
    ranked = sorted((how(f)[0], getattr(f, "timestamp", 0) or 0, rank, how(f)[1]) for rank, f in failures.items())
    _, _, rank, text = ranked[0]
    others = len(ranked) - 1
    return f"rank {rank} {text}" + (f"; {others} other rank(s) stopped" if others else "")


def main(argv: list[str] | None = None) -> int:
    """One rank: ``python -m terastack.gnn.training.multi_process JOB.json`` (written by :func:`run_training`)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = sys.argv[1:] if argv is None else argv
    job_path = Path(argv[0])
    saved = json.loads(job_path.read_text())
    job = GnnJob(**saved["job"])

    def entry() -> int:
        result = _as_rank(job, saved["timeout_s"], progress=saved["progress"] and dist_rank() == 0)
        if result is not None:
            atomic_write_json(job_path.parent / RESULT, json.loads(json.dumps(result, default=str)))
        return 0
    return record(entry)()


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(main())   # [Note: a process leaves without teardown]
