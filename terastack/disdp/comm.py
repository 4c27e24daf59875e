"""Point-to-point messages between roles, with bounded waits whose errors name the peer's rank and role.

Every message between two ranks is identified by a tag built from its kind,
its bucket and its phase (see :func:`tag`). Between one pair of ranks, messages
with the same tag are matched in the order they were posted, and each role
posts them in the order given by :class:`terastack.disdp.buckets.Schedule`, so
sender and receiver agree without any handshake.

Between start-up and shutdown only point-to-point operations are used:
collectives issued from several threads of one process could be ordered
differently on different ranks, p2p messages with distinct tags cannot.
(Start-up's layout check and broadcast and shutdown's monitored barrier run
on the main thread while no agent thread exists.)

[Note: process-group backend]
The backend follows the device the tensors on the wire live on: gloo for CPU
tensors, NCCL for CUDA tensors (:func:`backend_for`). The roles of ``terastack
dist`` keep their buckets in host memory today, so they join on gloo. NCCL
matches point-to-point messages between a pair of ranks only by their order (it
has no tags), and the pattern above relies on tags to keep messages of
different kinds and buckets apart when several threads post to the same peer;
so a :class:`Comm` on NCCL is refused with that reason rather than left to
mismatch buffers. Carrying the pattern to NCCL means one ordered channel per
pair of ranks (one poster thread per peer, messages posted in schedule order)
or control messages on a gloo side group.
"""
from __future__ import annotations

import datetime
import enum
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from terastack.disdp.roles import RoleMap


class Kind(enum.IntEnum):
    PARAM = 1        # server -> agent: a parameter chunk
    GRAD = 2         # agent -> aggregator (whole bucket) or agent -> server (chunk)
    AGG_GRAD = 3     # aggregator -> server: the reduced gradient chunk
    RELAY_PARAM = 4  # agent process -> its worker: a whole bucket of parameters
    RELAY_GRAD = 5   # worker -> its agent process: a whole bucket of gradients
    CKPT = 6         # server -> server 0: "my shard of step k is durable"
    STATS = 7        # worker -> its agent process: the loss of a step


def backend_for(device) -> str:
    """The torch.distributed backend for tensors on ``device`` (a torch.device or its name): "gloo" for the
    CPU, "nccl" for CUDA ([Note: process-group backend])."""
    kind = torch.device(device).type
    if kind == "cpu":
        return "gloo"
    if kind == "cuda":
        return "nccl"
    raise ValueError(f"device: terastack dist runs its messages on cpu (gloo) or cuda (nccl); got {device!r}")


def check_tagged_p2p(backend: str) -> None:
    """Refuse a backend that cannot match tagged point-to-point messages ([Note: process-group backend])."""
    if str(backend).lower() == "nccl":
        raise ValueError("backend: nccl matches point-to-point messages by order only (it has no tags), and "
                         "terastack dist tells its messages apart by tag; its roles run on the CPU over gloo")


def tag(kind: Kind, bucket: int = 0, phase: int = 0) -> int:
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
    tensor: torch.Tensor | None = None   # kept alive until the operation completes


class Comm:
    """The p2p endpoint of one rank: posts sends/receives, waits with a timeout, counts bytes."""

    def __init__(self, roles: RoleMap, rank: int, *, timeout_s: float, backend: str = "gloo"):
        check_tagged_p2p(backend)
        self.backend = backend
        self.roles = roles
        self.rank = rank
        self.me = roles.describe(rank)
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self.bytes_in = 0
        self.bytes_out = 0

    # ------------------------------------------------------------- posting
    def isend(self, tensor: torch.Tensor, dst: int, tg: int, what: str) -> Pending:
        return self._post(dist.isend, tensor, dst, tg, what, incoming=False)

    def irecv(self, tensor: torch.Tensor, src: int, tg: int, what: str) -> Pending:
        return self._post(dist.irecv, tensor, src, tg, what, incoming=True)

    def _post(self, op, tensor: torch.Tensor, peer: int, tg: int, what: str, *, incoming: bool) -> Pending:
        try:
            work = op(tensor, peer, tag=tg)
        except RuntimeError as exc:
            raise self._peer_error(exc, peer, f"{'receiving' if incoming else 'sending'} {what}") from None
        return Pending(work, peer, tensor.numel() * tensor.element_size(), what, incoming, tensor)

    # ------------------------------------------------------------- waiting
    def wait(self, pending: Pending, timeout_s: float | None = None) -> None:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            pending.work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as exc:
            verb = "receiving" if pending.incoming else "sending"
            raise self._peer_error(exc, pending.peer, f"{verb} {pending.what}", timeout) from None
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
