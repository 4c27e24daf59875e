"""Point-to-point messages between roles, with bounded waits whose errors name the peer's rank and role.

[Note: messages matched by order]
Messages between two ranks are matched by their order alone, as NCCL matches
them (it has no tags and no receive from any source): every message goes out
with tag 0 and names its peer. Each message kind travels on one of two
*channels*, a process group of its own ([Note: two channels]), and on a channel
each pair of ranks talks in one direction only; each role posts its messages
to a peer in the order :class:`terastack.disdp.buckets.Schedule` gives
(parameters in fetch order, gradients in gradient order), and the peer posts
the matching ones in the same order, so sender and receiver agree without a
header. :func:`tag` still names a message (its kind, bucket and phase) for
errors and records; it never reaches the wire.

Between start-up and shutdown only point-to-point operations are used on the
channels: collectives issued from several threads of one process could be
ordered differently on different ranks. Start-up's layout check and
broadcast, the step messages of a job and shutdown's monitored barrier run on
a gloo group ([Note: process-group backend]).

[Note: two channels]
NCCL runs the messages between a pair of ranks on one stream per process
group, in the order they were posted, both directions together: a large send
from A to B waits until B posts its receive. A worker's agent receives
parameters from a server on one thread while it sends gradients to the same
server on another, in an interleaving that depends on timing; on one group
the two ranks could post them in different orders and wait on each other. So
parameters (server -> agent, agent process -> worker, a server's slices of a
checkpoint) travel on the ``PARAMS`` channel and gradients (agent ->
aggregator or server, aggregator -> server, worker -> agent process) on the
``GRADS`` channel: on each channel a pair of ranks has one sender and one
receiver, each posting from one thread in schedule order.

NCCL also makes the communicator of a pair at the pair's first message, and the
first rank there waits for the other: a server that posts its first gradient
receive before its first parameter send would wait for an aggregator that
waits for gradients that wait for those parameters. So every pair that talks
(:func:`talking_pairs`) exchanges one element at start-up (:meth:`Comm.connect`,
on gloo too), all pairs in one global order: the first pair in it that is not
done has both its ranks waiting on it, so no two ranks wait on each other.

[Note: process-group backend]
The backend follows the job's device (:func:`backend_for`): gloo when the
ranks run on the CPU, NCCL on CUDA; every rank of terastack dist joins through
:func:`join_process_group`. On NCCL each rank uses the GPU ``LOCAL_RANK`` (set
as its current device at start-up), and the tensors of the data plane travel
through it (:func:`wire_device`): :class:`Comm` stages a host tensor onto that
device before a send and copies a receive back once it has landed, so the
roles keep their buckets where they are. Everything that is not the data
plane runs on gloo groups whatever the backend: the step messages and figures
of a job (:class:`terastack.disdp.control.Control`), the start-up checks and
the barrier at the end (NCCL has no monitored barrier, and its object
collectives need a device); the heartbeats go through the job's TCP store.
"""
from __future__ import annotations

import datetime
import enum
import os
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from terastack.disdp.roles import RoleMap
from terastack.training.job.engine_sections import DISDP_DEVICES


class Kind(enum.IntEnum):
    PARAM = 1        # server -> agent: a parameter chunk
    GRAD = 2         # agent -> aggregator (whole bucket) or agent -> server (chunk)
    AGG_GRAD = 3     # aggregator -> server: the reduced gradient chunk
    RELAY_PARAM = 4  # agent process -> its worker: a whole bucket of parameters
    RELAY_GRAD = 5   # worker -> its agent process: a whole bucket of gradients
    CKPT = 6         # server -> server 0: its slices of a checkpoint (terastack.disdp.server_state)
    STATS = 7        # worker -> its agent process: the loss of a step


class Channel(enum.IntEnum):
    """The process group a message travels on ([Note: two channels])."""
    PARAMS = 0
    GRADS = 1


#: the channel of each kind of message: on each, a pair of ranks talks in one direction ([Note: two channels])
CHANNEL_OF = {Kind.PARAM: Channel.PARAMS, Kind.RELAY_PARAM: Channel.PARAMS, Kind.CKPT: Channel.PARAMS,
              Kind.GRAD: Channel.GRADS, Kind.AGG_GRAD: Channel.GRADS, Kind.RELAY_GRAD: Channel.GRADS,
              Kind.STATS: Channel.GRADS}
#: a kind of message on each channel (to name the channel)
_KIND_ON = {Channel.PARAMS: Kind.PARAM, Channel.GRADS: Kind.GRAD}
#: where ranks' messages travel: the job's choices (one copy, in the job's disdp section)
DEVICES = DISDP_DEVICES


def backend_for(device) -> str:
    """The torch.distributed backend of a job whose ranks run on ``device`` (a torch.device or its name): "gloo"
    for the CPU, "nccl" for CUDA, refused when CUDA is not available ([Note: process-group backend])."""
    kind = torch.device(device).type
    if kind == "cpu":
        return "gloo"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asks for NCCL, but this PyTorch sees no CUDA device (a CPU-only "
                             "build, no GPU, or CUDA_VISIBLE_DEVICES empty); run with device cpu (gloo)")
        return "nccl"
    raise ValueError(f"device: terastack dist runs its messages on cpu (gloo) or cuda (nccl); got {device!r}")


def local_rank() -> int:
    """This rank's index on its node (torchrun's ``LOCAL_RANK``)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def wire_device(backend: str) -> torch.device:
    """Where the data plane's tensors travel: the host for gloo, this rank's GPU (``LOCAL_RANK``, by index: a
    bare "cuda" means GPU 0 on the agents' threads) for NCCL."""
    if backend == "nccl":
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def join_process_group(device, *, rank: int, world_size: int, timeout_s: float, init_method: str | None = None) -> str:
    """Join the job's process group on the backend ``device`` asks for ([Note: process-group backend]); the
    backend. On NCCL this rank's GPU becomes its current device first. ``init_method``: where the ranks meet
    (default: torchrun's environment)."""
    backend = backend_for(device)
    if backend == "nccl":
        if local_rank() >= torch.cuda.device_count():
            raise ValueError(f"device: rank {rank} is local rank {local_rank()} on its node but there are "
                             f"{torch.cuda.device_count()} GPUs: one GPU per rank (fewer ranks per node, or "
                             "device cpu)")
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=init_method,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return backend


def gloo_group(timeout_s: float):
    """A gloo group of every rank, for what is not the data plane ([Note: process-group backend]): the default
    group where that is gloo already, else a new one (collective: every rank calls it at the same point)."""
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def tag(kind: Kind, bucket: int = 0, phase: int = 0) -> int:
    """A message's name (its kind, bucket and phase), for errors and records; never sent ([Note: messages
    matched by order])."""
    return int(kind) * 1_000_000 + phase * 100_000 + bucket


class PeerError(RuntimeError):
    """A peer died, closed its connection or did not answer in time. Names the peer's rank and role."""

    def __init__(self, message: str, *, peer_rank: int | None = None, peer_role: str | None = None):
        super().__init__(message)
        self.peer_rank = peer_rank
        self.peer_role = peer_role


@dataclass(slots=True)
class Pending:
    """One posted send or receive; ``Comm.wait`` completes it."""
    work: object
    peer: int
    nbytes: int
    what: str
    incoming: bool
    tensor: torch.Tensor | None = None   # kept alive until the operation completes (staged: the wire's copy)
    dest: torch.Tensor | None = None     # a staged receive: where the landed message is copied to


def talking_pairs(roles: RoleMap) -> list[tuple[Channel, int, int]]:
    """(channel, lower rank, higher rank) of every pair of ranks that exchanges messages, in one global order
    ([Note: two channels])."""
    out: set[tuple[Channel, int, int]] = set()

    def add(channel: Channel, a: int, b: int) -> None:
        out.add((channel, min(a, b), max(a, b)))

    servers = [roles.server_rank(s) for s in range(roles.servers)]
    agents = roles.agent_ranks()
    for s in servers:
        if s != servers[0]:
            add(Channel.PARAMS, s, servers[0])   # a checkpoint's slices
        for a in agents:
            add(Channel.PARAMS, s, a)
            if not roles.aggregator:
                add(Channel.GRADS, a, s)
    if roles.aggregator:
        for r in (*agents, *servers):
            add(Channel.GRADS, r, roles.aggregator_rank)
    if roles.agents == "process":
        for w in range(roles.workers):
            for c in Channel:
                add(c, roles.worker_rank(w), roles.agent_rank(w))
    return sorted(out)


class Comm:
    """The p2p endpoint of one rank: posts sends/receives, waits with a timeout, counts bytes.

    ``groups``: the process group of each channel ([Note: two channels]; :meth:`open` makes them); None: the
    default group carries both (a single-threaded test, or a job of one sender per peer)."""

    def __init__(self, roles: RoleMap, rank: int, *, timeout_s: float, backend: str = "gloo",
                 groups: dict | None = None):
        self.backend = backend
        self.wire = wire_device(backend)
        self.groups = groups or {}
        self.roles = roles
        self.rank = rank
        self.me = roles.describe(rank) if roles is not None else f"rank {rank}"
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self.bytes_in = 0
        self.bytes_out = 0

    @classmethod
    def open(cls, roles: RoleMap, rank: int, *, timeout_s: float, backend: str) -> "Comm":
        """The endpoint with a process group per channel on ``backend`` (collective: every rank opens it at the
        same point of its start-up)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        groups = {c: dist.new_group(backend=backend, timeout=timeout) for c in Channel}
        comm = cls(roles, rank, timeout_s=timeout_s, backend=backend, groups=groups)
        comm.connect()   # needed on NCCL; on gloo it runs the same order, so the CPU tests run it too
        return comm

    def connect(self) -> None:
        """Make the communicator of every pair this rank talks in, in the global order of
        :func:`talking_pairs` ([Note: two channels]): one element from the lower rank to the higher."""
        for channel, a, b in talking_pairs(self.roles):
            if self.rank == a:
                self.wait(self.isend(torch.zeros(1, device=self.wire), b, tag(_KIND_ON[channel]), "a first message"))
            elif self.rank == b:
                self.wait(self.irecv(torch.zeros(1, device=self.wire), a, tag(_KIND_ON[channel]), "a first message"))

    # ------------------------------------------------------------- posting
    def isend(self, tensor: torch.Tensor, dst: int, tg: int, what: str) -> Pending:
        return self._post(dist.isend, tensor, dst, tg, what, incoming=False)

    def irecv(self, tensor: torch.Tensor, src: int, tg: int, what: str) -> Pending:
        return self._post(dist.irecv, tensor, src, tg, what, incoming=True)

    def _post(self, op, tensor: torch.Tensor, peer: int, tg: int, what: str, *, incoming: bool) -> Pending:
        if peer is None:
            raise ValueError(f"{self.me}: {what}: every message names its peer ([Note: messages matched by order])")
        group = self.groups.get(CHANNEL_OF[Kind(tg // 1_000_000)])
        dest = None
        wire = tensor
        if tensor.device != self.wire:   # [Note: process-group backend] staged through this rank's GPU
            if incoming:
                dest, wire = tensor, torch.empty(tensor.shape, dtype=tensor.dtype, device=self.wire)
            else:
                wire = tensor.to(self.wire)
        try:
            work = op(wire, peer, group=group)   # tag 0: matched by order ([Note: messages matched by order])
        except RuntimeError as exc:
            raise self._peer_error(exc, peer, f"{'receiving' if incoming else 'sending'} {what}") from None
        return Pending(work, peer, tensor.numel() * tensor.element_size(), what, incoming, wire, dest)

    # ------------------------------------------------------------- waiting
    def wait(self, pending: Pending, timeout_s: float | None = None) -> None:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            pending.work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as exc:
            verb = "receiving" if pending.incoming else "sending"
            raise self._peer_error(exc, pending.peer, f"{verb} {pending.what}", timeout) from None
        if pending.dest is not None:
            pending.dest.copy_(pending.tensor)
            pending.dest = None
        with self._lock:
            if pending.incoming:
                self.bytes_in += pending.nbytes
            else:
                self.bytes_out += pending.nbytes

    def wait_all(self, pendings: list[Pending], timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        for p in pendings:
            self.wait(p, max(0.001, deadline - time.monotonic()))

    def send(self, tensor: torch.Tensor, dst: int, tg: int, what: str) -> None:
        self.wait(self.isend(tensor, dst, tg, what))

    def recv(self, tensor: torch.Tensor, src: int, tg: int, what: str) -> torch.Tensor:
        self.wait(self.irecv(tensor, src, tg, what))
        return tensor

    def counters(self) -> tuple[int, int]:
        with self._lock:
            return self.bytes_in, self.bytes_out

    def _peer_error(self, exc: BaseException, peer: int, doing: str, timeout: float | None = None) -> PeerError:
        who = self.roles.describe(peer)
        text = str(exc)
        if "Timed out" in text or "timed out" in text:
            reason = (f"no answer within {timeout if timeout is not None else self.timeout_s:g} s (it is hung, "
                      "overloaded, or itself waiting on another rank)")
        elif "closed" in text.lower() or "reset" in text.lower() or "broken pipe" in text.lower():
            reason = "its connection closed (the process died or stopped)"
        else:
            reason = text.splitlines()[0][:200]
        return PeerError(f"{self.me}: lost {who} while {doing}: {reason}", peer_rank=peer,
                         peer_role=who)
