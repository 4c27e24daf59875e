"""Running a job on this machine: :func:`launch_local` starts every rank under torchrun's elastic agent,
:func:`rank_main` is how each rank reads the job back, and :func:`describe_failures` turns torchrun's
per-rank failure records into one message.

[Note: failures]
Every wait has a timeout and every lost peer raises :class:`~terastack.disdp.comm.PeerError` naming
its rank and role. Under torchrun a rank that dies (or raises) ends the job:
torchrun stops the other ranks, and :func:`launch_local` turns torchrun's
per-rank failure records into one message naming the first rank to fail, its
role and the last checkpoint to resume from. Checkpoints are the servers'
state, so ``--resume`` loses nothing that was checkpointed. A job's ranks also tell a lost node from a failed
rank by their heartbeats ([Note: a lost node] in :mod:`terastack.disdp.control`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import threading
from pathlib import Path

from terastack.atomic import atomic_write_json
from terastack.disdp.comm import backend_for
from terastack.disdp.train_config import TrainConfig
from terastack.disdp.roles import RoleMap
from terastack.disdp.job_stats import collect_stats, stats_dir
from terastack.disdp.shutdown import exit_rank
from terastack.training.checkpoint import latest_step
from terastack.local_ranks import agent_logs, launch_config, rank_command

#: the program every rank of the disaggregated job runs (``python -m MODULE JOB.json``)
JOB_MODULE = "terastack.disdp.run"
#: set by the launcher for its ranks: "1" turns their progress lines off
QUIET_ENV = "TERASTACK_DIST_QUIET"


class JobFailed(RuntimeError):
    """A rank of the job died or failed; the message names the first one, its role and how to resume."""


#: torchrun's agent answers these signals by stopping the ranks; SIGINT is left to the ranks of a job
#: ([Note: Ctrl-C on a job])
_AGENT_SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
_AGENT_SIGNALS_BUT_SIGINT = "SIGTERM,SIGHUP,SIGQUIT"


def classify_failure(failure) -> tuple[str, str]:
    """How one rank ended, from torchrun's failure record (``exitcode``, ``message``: text or its error file's
    dict): ("error", the last line of its message) for a rank that raised; ("killed", signal) for one ended by
    a signal it did not raise over; ("stopped", "SIGTERM") for one torchrun stopped after the first failure."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    message = str(message or "").strip()
    noted = re.match(r"Signal \d+ \((SIG\w+)\) received", message)   # torchrun's note of a signal death
    if message and not noted:
        return "error", message.splitlines()[-1]
    sig = noted.group(1) if noted else None
    if failure.exitcode is not None and failure.exitcode < 0:
        try:
            sig = signal.Signals(-failure.exitcode).name
        except ValueError:
            sig = f"signal {-failure.exitcode}"
    if sig is None:
        return "error", f"exit code {failure.exitcode}"
    return ("stopped" if sig == "SIGTERM" else "killed"), sig


def describe_failures(roles: RoleMap, failures: dict, resume_hint: str) -> str:
    """One message from torchrun's per-rank failure records, naming the first rank to fail and its role.

    A rank killed by a signal (other than SIGTERM) is the likeliest root cause;
    then ranks that raised, earliest first; ranks that torchrun itself stopped
    with SIGTERM after the first failure are only counted.
    """
    rank_of_kind = {"killed": 0, "error": 1, "stopped": 2}
    classified = sorted(((rank_of_kind[kind], getattr(f, "timestamp", 0) or 0, rank, kind, text)
                         for rank, f in failures.items() for kind, text in [classify_failure(f)]))
    parts, stopped = [], 0
    for _, _, rank, kind, text in classified:
        who = roles.describe(rank) if 0 <= rank < roles.world_size else f"rank {rank}"
        if kind == "stopped":
            stopped += 1
        else:
            parts.append(f"{who} died ({text})" if kind == "killed" else f"{who} failed: {text}")
    if not parts:
        parts.append(f"{stopped} rank(s) were stopped with SIGTERM")
    elif stopped:
        parts.append(f"{stopped} other rank(s) were stopped")
    return "; then ".join(parts[:3]) + resume_hint


def launch_local(config: TrainConfig, *, quiet: bool = False, module: str = JOB_MODULE,
                 world_size: int | None = None) -> dict:
    """Run the job on this machine under torchrun's elastic agent (c10d rendezvous on loopback).

    ``module`` is the program every rank runs (``python -m MODULE JOB.json``):
    the disaggregated job by default, or a baseline that needs only workers.
    """
    backend_for(config.device)   # NCCL without CUDA is refused here, once, before any rank starts
    roles = config.roles()
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(stats_dir(config), ignore_errors=True)
    if not config.resume:
        shutil.rmtree(config.checkpoint_dir, ignore_errors=True)
    job_file = atomic_write_json(run_dir / "job.json", config.to_dict())

    def resume_hint() -> str:
        step = latest_step(config.checkpoint_dir)
        return (f"; the last checkpoint is step {step} in {config.checkpoint_dir}: rerun with --resume to "
                "continue" if step is not None else "; no checkpoint was completed")

    launch_ranks(roles, module, [str(job_file)], world_size=world_size or roles.world_size,
                 timeout_s=config.timeout_s, quiet=quiet, resume_hint=resume_hint)
    return collect_stats(config, world_size or roles.world_size)


def launch_ranks(roles: RoleMap, module: str, args: list[str], *, world_size: int, timeout_s: float,
                 quiet: bool = False, resume_hint=lambda: "", interruptible: bool = False,
                 preload: tuple[str, ...] = (), warm: bool = True) -> bool:
    """Start ``world_size`` ranks of ``python -m MODULE ARGS...`` under torchrun's elastic agent (c10d rendezvous
    on loopback) and wait for them; a failed rank raises :class:`JobFailed` ([Note: failures]), its message ended
    by ``resume_hint()``. ``interruptible``: the ranks stop in order on SIGINT ([Note: Ctrl-C on a job]): the
    launcher passes it on to them and waits; True if a SIGINT came (False: none, or ``interruptible`` is not
    set). ``preload`` (what MODULE imports only once it runs) and ``warm``: how the ranks start
    (:func:`~terastack.local_ranks.rank_command`)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    with agent_logs() as logs, rank_command(module, args, preload=preload, warm=warm) as (entrypoint, rank_args):
        # failure records are read inside: the directory goes after
        launch = launch_config(world_size, name="terastack", timeout_s=timeout_s, logs=logs)
        env = {QUIET_ENV: "1" if quiet else "0", _AGENT_SIGNALS_ENV: os.environ.get(_AGENT_SIGNALS_ENV)}
        relay, previous = _InterruptRelay(module), None
        if interruptible and threading.current_thread() is threading.main_thread():
            # torchrun's launcher sets the variable from its config (older ones read only the variable)
            launch.signals_to_handle = env[_AGENT_SIGNALS_ENV] = _AGENT_SIGNALS_BUT_SIGINT
            previous = signal.signal(signal.SIGINT, relay)
        env_before = {name: os.environ.get(name) for name in env}
        os.environ.update({name: value for name, value in env.items() if value is not None})
        try:
            elastic_launch(launch, entrypoint)(*rank_args)
        except ChildFailedError as exc:
            raise JobFailed(describe_failures(roles, exc.failures, resume_hint())) from None
        except SignalException:
            if not relay.seen.is_set():
                raise
            return True   # a second Ctrl-C: torchrun's agent has stopped the ranks
        finally:
            for name, value in env_before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return relay.seen.is_set()


class _InterruptRelay:
    """The launcher's SIGINT handler ([Note: Ctrl-C on a job]): the first SIGINT is passed on to the ranks (a
    SIGINT sent to the launcher alone reaches rank 0 too; one sent to the process group reaches it twice, which
    changes nothing) and the launcher waits for them to leave; a second one has torchrun's agent stop them as it
    stops them on SIGTERM (the signal, then SIGKILL after its shutdown timeout)."""

    def __init__(self, module: str):
        self.module = module
        self.seen = threading.Event()

    def __call__(self, signum, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if self.seen.is_set():
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
        self.seen.set()
        for pid in _child_ranks(self.module):
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass


def _child_ranks(module: str) -> list[int]:
    """The pids of this process's children that run ``python -m MODULE`` (Linux ``/proc``; [] elsewhere)."""
    pids = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    ranks = []
    for pid in pids:
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in words:
            ranks.append(pid)
    return ranks


def rank_main(entry, argv: list[str] | None = None) -> int:
    """``python -m MODULE JOB.json``: read the job's config and run ``entry(config)`` under torchrun's error record."""
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = sys.argv[1:] if argv is None else argv
    config = TrainConfig.from_dict(json.loads(Path(argv[0]).read_text()), source=argv[0])
    if os.environ.get(QUIET_ENV) == "1":
        config.progress = False
    return exit_rank(record(entry), config)   # [Note: a thread inside the network at exit]
