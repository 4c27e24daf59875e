"""The control plane of a job: rank 0 runs the job's loop and tells every other rank what comes next.

[Note: step messages]
In a job (``terastack dist train --config job.yaml``) worker 0 (rank 0) drives the shared loop
(:mod:`terastack.training.loop`) through :class:`~terastack.disdp.job_engine.DisdpEngine`; every other rank
follows. Each thing the loop asks of the engine becomes one :class:`Command`, broadcast from rank 0 on a
process group of its own (the data plane's point-to-point traffic never waits behind it):

    TRAIN   one pass (forward, backward, gradients to the servers) over worker i's rows of one micro-batch;
            the servers add the gradients up and update after the step's last micro-batch (``apply``),
            clipped by the global norm when ``max_grad_norm`` is set; ``targets``: the step's target tokens,
            the loss's denominator, so the workers' gradients add up to the gradient of the whole batch
    EVAL    the same pass with the gradients dropped by the servers (a validation loss)
    SAVE    the servers send their state (parameters, moments, step) to rank 0, which writes the checkpoint
    LOAD    rank 0 sends every server its slices of a checkpoint's state
    EXPORT  the servers send their parameters to rank 0, which writes the model
    STOP    every rank reports its memory figures (the most of each over the ranks) and leaves

After a pass every rank adds its figures into one all-reduce (the workers' losses, the servers' gradient
norm), so rank 0 has the step's loss when the call returns. Rank 0 sends each other worker its rows of the
micro-batch right after the command (the batch is split by rows; a worker without rows runs one row that has
no target token, so the pass's schedule is the same on every rank).

[Note: a lost node]
A node that dies (the machine, or its torchrun and every rank under it) closes its ranks' connections, and the
ranks still running see their next message to or from them fail, or time out after ``disdp.timeout_s``; the
error names an address, not a rank. So every rank beats (:class:`Liveness`): a thread adds one to its counter
``beat/RANK`` in the store torchrun starts for the job's ranks (``MASTER_ADDR:MASTER_PORT``, hosted by node 0's
torchrun) every ``BEAT_S``. A rank whose work fails with a communication error reads every counter, waits
``LOST_WINDOW_S`` and reads them again: the ranks whose counters stood still are lost (a rank that leaves on
its own says so first, ``left/RANK``, and is not counted). When the store itself does not answer, node 0 is
the lost node. The first rank to conclude claims the report in the store (without it: the first of its node,
by creating a file named after the job in the temp dir) and prints one line,
``terastack dist: lost rank R on node N (...)``, with where to resume from; it and the others leave, and
torchrun stops the rest of each node. ``--resume`` from the last checkpoint continues exactly (checkpoints are
the servers' state, written by rank 0).
"""
from __future__ import annotations

import datetime
import enum
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from terastack.disdp.roles import RoleMap
from terastack.disdp.shutdown import stop_point, track

#: how often a rank beats, and how long a rank that suspects a lost peer watches the beats ([Note: a lost node])
BEAT_S = 0.5
LOST_WINDOW_S = 3.0
#: labels that are not targets (transformers' ignore index)
IGNORE = -100
_KEYS = ("attention_mask", "position_ids")


class Op(enum.IntEnum):
    TRAIN = 1
    EVAL = 2
    SAVE = 3
    LOAD = 4
    EXPORT = 5
    STOP = 6


@dataclass(kw_only=True, slots=True)
class Command:
    """One step message ([Note: step messages])."""

    op: Op
    pass_index: int = 0
    lr: float = 0.0
    targets: int = 0
    apply: bool = False
    #: 0: no clipping
    max_grad_norm: float = 0.0
    adam_step: float = 0.0

    def encode(self) -> torch.Tensor:
        return torch.tensor([int(self.op), self.pass_index, self.lr, self.targets, float(self.apply),
                             self.max_grad_norm, self.adam_step, 0.0], dtype=torch.float64)

    @classmethod
    def decode(cls, t: torch.Tensor) -> "Command":
        v = t.tolist()
        return cls(op=Op(int(v[0])), pass_index=int(v[1]), lr=v[2], targets=int(v[3]), apply=bool(v[4]),
                   max_grad_norm=v[5], adam_step=v[6])


class Control:
    """Rank 0's commands and the figures every rank reports back, on process groups of their own."""

    def __init__(self, roles: RoleMap, rank: int, *, timeout_s: float):
        self.roles = roles
        self.rank = rank
        timeout = datetime.timedelta(seconds=timeout_s)
        # new_group is collective: every rank creates both groups, in this order
        self.group = dist.new_group(backend="gloo", timeout=timeout)
        self.servers = dist.new_group(ranks=[roles.server_rank(s) for s in range(roles.servers)], backend="gloo",
                                      timeout=timeout)

    # ------------------------------------------------------------- commands
    def announce(self, command: Command) -> None:
        stop_point()   # Ctrl-C stops rank 0 here, between commands ([Note: Ctrl-C on a job])
        dist.broadcast(command.encode(), src=0, group=self.group)

    def next(self) -> Command:
        t = torch.zeros(8, dtype=torch.float64)
        dist.broadcast(t, src=0, group=self.group)
        return Command.decode(t)

    def add_up(self, values: list[float]) -> list[float]:
        """Every rank's ``values`` added up (every rank calls it after each pass)."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.group)
        return t.tolist()

    def max_of(self, values: list[float]) -> list[float]:
        """The largest of every rank's ``values``, element by element (every rank calls it after STOP)."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    # ---------------------------------------------------------------- data
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor.contiguous(), dst, group=self.group)

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(tensor, src, group=self.group)
        return tensor

    def send_rows(self, batch: dict, dst: int) -> None:
        ids = batch["input_ids"]
        flags = sum(1 << i for i, k in enumerate(_KEYS) if batch.get(k) is not None)
        self.send(torch.tensor([ids.shape[0], ids.shape[1], flags], dtype=torch.int64), dst)
        for key in ("input_ids", "labels", *_KEYS):
            if batch.get(key) is not None:
                self.send(batch[key].to(torch.int64), dst)

    def recv_rows(self, src: int = 0) -> dict:
        rows, seq, flags = self.recv(torch.zeros(3, dtype=torch.int64), src).tolist()
        out = {}
        for i, key in enumerate(("input_ids", "labels", *_KEYS)):
            if i < 2 or flags & (1 << (i - 2)):
                out[key] = self.recv(torch.zeros(rows, seq, dtype=torch.int64), src)
        return out


def split_rows(batch: dict, workers: int) -> list[dict]:
    """Worker i's rows of a micro-batch (contiguous, sizes differing by at most one); a worker left without rows
    gets one row with no target token (its loss and gradient are zero)."""
    parts = []
    pieces = {k: torch.tensor_split(v, workers) for k, v in batch.items() if v is not None}
    for w in range(workers):
        part = {k: v[w] for k, v in pieces.items()}
        if part["input_ids"].shape[0] == 0:
            seq = batch["input_ids"].shape[1]
            part = {"input_ids": torch.zeros(1, seq, dtype=torch.int64),
                    "labels": torch.full((1, seq), IGNORE, dtype=torch.int64)}
            if batch.get("position_ids") is not None:
                part["position_ids"] = torch.arange(seq).unsqueeze(0)
        parts.append(part)
    return parts


def target_tokens(batch: dict) -> int:
    """Labels that count in the loss: those other than -100 after the shift by one."""
    return int((batch["labels"][:, 1:] != IGNORE).sum())


# ------------------------------------------------------------------ liveness


def job_store(timeout_s: float = 10.0):
    """A client of the store torchrun started for the job's ranks (node 0's torchrun hosts it)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    # a torchrun that restarts its ranks starts them against the same store: one namespace per attempt
    return dist.PrefixStore(f"terastack/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


class Liveness:
    """This rank's heartbeat, and which ranks stopped beating ([Note: a lost node]).

    ``connect()`` returns a store client; the beating thread and the rank's own thread get one each, both made
    at start. The default is torchrun's store."""

    def __init__(self, rank: int, world_size: int, *, connect=job_store, beat_s: float = BEAT_S):
        self.rank, self.world_size = rank, world_size
        self.connect, self.beat_s = connect, beat_s
        self._stop = threading.Event()
        self._store = connect()
        self._store.add(f"beat/{rank}", 1)
        beat_store = connect()
        self._thread = track(threading.Thread(target=self._beat, args=(beat_store,), name=f"terastack-beat-{rank}",
                                              daemon=True))
        self._thread.start()

    def _beat(self, store) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                store.add(f"beat/{self.rank}", 1)
            except Exception:   # the store is gone with node 0: lost() says so
                return

    def lost(self, window_s: float = LOST_WINDOW_S) -> list[int] | None:
        """The ranks (other than this one) whose beat stood still for ``window_s``; None when the store does not
        answer (node 0, which hosts it, is lost)."""
        others = [r for r in range(self.world_size) if r != self.rank]
        try:
            # this thread's client, connected at start: a new one would retry a store that is gone until its timeout
            store = self._store
            before = [store.add(f"beat/{r}", 0) for r in others]   # add(key, 0) reads without waiting
            time.sleep(window_s)
            after = [store.add(f"beat/{r}", 0) for r in others]
            left = [store.add(f"left/{r}", 0) for r in others]
        except Exception:
            return None
        return [r for r, b, a, gone in zip(others, before, after, left) if a == b and not gone]

    def claim_report(self) -> bool:
        """True for the first rank to ask (that rank prints the line). Without the store (node 0 lost) the first
        rank of each node that asks, claimed by creating a file named after the job's store in the temp dir."""
        try:
            return self._store.add("reported", 1) == 1
        except Exception:
            pass
        name = "terastack-lost-" + "-".join(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT",
                                                                           "TORCHELASTIC_RESTART_COUNT"))
        try:
            os.close(os.open(os.path.join(tempfile.gettempdir(), name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        except OSError:
            pass
        return True

    def close(self, timeout_s: float = 15.0) -> None:
        """Stop beating, saying this rank leaves on its own (so that nobody takes it for lost), and wait for the
        beating thread to end: it calls into the store, and must not be inside it when the process exits
        ([Note: a thread inside the network at exit] in terastack.disdp.shutdown). ``timeout_s`` bounds the
        wait (a store that stopped answering times the thread's call out after ``job_store``'s 10 s)."""
        try:
            self._store.add(f"left/{self.rank}", 1)
        except Exception:
            pass
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)


def short_reason(exc: BaseException) -> str:
    """The gist of a communication error: its first line without gloo's source location and advice."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", text)
    return text.split(". This is typically")[0].rstrip(". ")[:200]


def lost_line(roles: RoleMap, lost: list[int] | None, reason: str) -> str:
    """``lost rank R on node N (...)``: the lowest lost rank, its node and role, the node's other lost ranks and
    what failed. ``lost`` None: node 0 (whose torchrun hosts the job's store) stopped answering."""
    nodes = roles.nodes or tuple((0, "?") for _ in range(roles.world_size))
    if lost is None:
        lost = [r for r in range(roles.world_size) if nodes[r][0] == 0]
        why = "the job's store on node 0 stopped answering"
    else:
        why = f"no heartbeat for {LOST_WINDOW_S:g} s"
    first = min(lost)
    node, host = nodes[first]
    role, index = roles.role_of(first)
    label = role.value if role.value == "aggregator" else f"{role.value} {index}"
    also = [r for r in lost if r != first]
    return (f"lost rank {first} on node {node} ({label} on host {host}"
            + (f"; also lost: rank{'s' if len(also) > 1 else ''} {', '.join(map(str, also))}" if also else "")
            + f"; {why}; {reason})")
