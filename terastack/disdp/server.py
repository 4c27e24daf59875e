"""A parameter-server shard: fp32 master weights and the optimizer's state for its key ranges, and the update.

Server ``s`` owns slice ``s`` of every bucket (:meth:`Layout.shard`). Per step
it sends its parameter slices to every agent in the schedule's fetch order,
then, as the reduced gradients arrive bucket by bucket (last layer first),
applies the job's optimizer to each slice — overlapping the update of one bucket with the
workers' backward of the next.

The update is the job's optimizer format's own (terastack.plan.optimizer_formats: PyTorch's single-tensor
AdamW, bitsandbytes' 8-bit AdamW, PyTorch's Adafactor), over the slice's pieces of parameters as
``terastack finetune`` hands it its chunks ([Note: a slice's optimizer state] in terastack.disdp.slice_state), so
a server's update equals the single-process job's on the same gradients.

[Note: where the optimizer state lives]
``state="memory"``: parameters and optimizer state are host tensors. ``state="ssd"``:
the optimizer state (AdamW's moments: two thirds of the state) rests on SSD in a
:class:`terastack.tiers.TieredStore`; the state of the next bucket in
gradient order is prefetched while the current bucket is updated, and each
bucket's is written back and evicted right after, so the host holds the
state of at most two buckets. The fp32 parameters stay in host memory (they
are sent to every agent twice per step), or with ``tier_params`` rest on the
SSD too, read in for their sends and their update.

[Note: the server's host memory]
With ``state="ssd"`` parameters and optimizer state share one tiered store whose host
budget is ``host_budget`` (a job's ``store.host_budget``). A step cannot do
without its *working set* (:meth:`ParameterServer.Config.working_set`): the
parameters of the sends in flight, the bucket being updated (parameters and
optimizer state: AdamW's two moments), and the state of the bucket before it while it is written
back. Everything else is read ahead only into free room, and dropped again
(unmodified) when a take needs the room, so the budget bounds the store's
memory whatever the SSD's speed; a budget below the working set is refused at
start-up. By default the budget is the working set (a job's servers send one
bucket at a time: at 1.1B, where the largest slice is 262 MB, 1.6 GB for one
server); a layer's slices are smaller than the largest, so what is left of it
holds the next bucket read ahead. Gradients a step keeps past their arrival
(accumulation, clipping) rest in the store's SSD as well ([Note: gradients kept
past their arrival]), read back one bucket at a time.
The gradients being received are outside the store: ``recv_ahead`` buckets per
worker (or per aggregator), and the sum of the one being applied.

[Note: sends a gradient ahead]
With tiered parameters a server posts its parameter sends as it goes, at most
``send_window`` buckets in flight. In the backward a worker needs layer l-1's
second delivery right after it sent layer l's gradient; posted only once l's
gradient had arrived and been applied, that delivery waited for the whole update
of l (moments from the SSD, AdamW, the write-back), and the workers' backward ran
in lockstep with the server's updates (at 150M: 0.3 of the step waited on
backward deliveries). So before waiting for gradient b the server posts the
sends of every delivery the workers need before their *next* gradient too: the
delivery travels while b's gradient is on its way and b is updated. The window
is unchanged (the working set counts ``send_window`` sends in flight), and so
is the order of everything a worker sees.
"""
from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass
from pathlib import Path

from types import SimpleNamespace

import torch
import torch.distributed as dist

from terastack import trace
from terastack.constants import padded_size
from terastack.disdp.comm import Comm, Kind, Pending, tag
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.roles import RoleMap
from terastack.disdp.server_memory import HostParams, MemoryState, StateStore, TieredParams, TieredState
from terastack.disdp.slice_state import SliceState
from terastack.units import format_bytes
from terastack.training.job.engine_sections import DISDP_STATES

#: where the servers keep their state: the job's choices (one copy, in the job's disdp section)
STATES = DISDP_STATES


@dataclass(kw_only=True, slots=True)
class AdamWConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        for f in ("beta1", "beta2"):
            if not 0 <= getattr(self, f) < 1:
                raise ValueError(f"{f}: must be in [0, 1), got {getattr(self, f)}")
        if self.eps <= 0 or self.weight_decay < 0:
            raise ValueError("eps: must be > 0 and weight_decay >= 0")


class ParameterServer:
    """One shard of the parameter server."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        state: str = "memory"
        #: scratch directory for ``state="ssd"``
        store_root: str = ""
        #: gradient buckets whose receives are posted ahead of the one being applied
        recv_ahead: int = 2
        #: with state="ssd": the fp32 parameters rest on the SSD too (else in host memory)
        tier_params: bool = False
        #: with tiered parameters: buckets whose parameter sends may be in flight at once
        send_window: int = 2
        #: with state="ssd": host memory for the state's working copies, bytes (None: the working set,
        #: :meth:`host_budget_of`; [Note: the server's host memory])
        host_budget: int | None = None
        #: without the aggregator: average the workers' gradients (True) or add them (a job's workers divide
        #: their losses by the whole batch's target tokens already)
        mean: bool = True

        def __post_init__(self) -> None:
            if self.state not in STATES:
                raise ValueError(f"state: must be one of {', '.join(STATES)}; got {self.state!r}")
            if self.state == "ssd" and not self.store_root:
                raise ValueError("store_root: a directory is required for state='ssd'")
            if self.recv_ahead < 1:
                raise ValueError(f"recv_ahead: must be >= 1, got {self.recv_ahead}")
            if self.host_budget is not None and self.host_budget <= 0:
                raise ValueError(f"host_budget: must be > 0 bytes, got {self.host_budget}")

        def working_set(self, largest: int, state: int | None = None) -> int:
            """The host bytes a step cannot do without, ``largest`` the padded bytes of the largest slice and
            ``state`` of the largest slice's optimizer state (default: AdamW's two moments, ``2 * largest``): the
            parameters of the sends in flight, one bucket's parameters and state being updated, and the state
            of the bucket before it still being written back ([Note: the server's host memory])."""
            state = 2 * largest if state is None else state
            return ((self.send_window if self.tier_params else 0) + 1) * largest + 2 * state

        def host_budget_of(self, largest: int, state: int | None = None) -> int:
            """This server's host budget: the setting, or the working set (what it reads ahead then fits in the
            room the working set leaves while its largest slices are not all in use)."""
            if self.host_budget is not None:
                return self.host_budget
            return self.working_set(largest, state)

    def __init__(self, config: "ParameterServer.Config", *, index: int, roles: RoleMap, comm: Comm,
                 layout: Layout, schedule: Schedule, adamw_config: AdamWConfig,
                 initial: list[torch.Tensor] | None = None, shard: dict[int, torch.Tensor] | None = None):
        """``initial``: the full flat fp32 vector of every bucket (only this server's slices are kept); or
        ``shard``: this server's slice of every bucket."""
        self.config = config
        self.index = index
        self.roles = roles
        self.comm = comm
        self.layout = layout
        self.schedule = schedule
        self.opt = adamw_config
        # ``shard`` may be a mapping that makes each bucket's slice when asked: tiered parameters then take one
        # bucket's slice into memory at a time on their way to the SSD
        shapes = {b: hi - lo for b in range(len(layout.buckets)) for lo, hi in [layout.shard(b, index)]}
        params = shard if shard is not None else {b: initial[b][lo:hi].clone() for b in shapes
                                                  for lo, hi in [layout.shard(b, index)]}
        self.buckets = list(shapes)
        self.slices = {b: SliceState(layout, b, index) for b in shapes}
        self.store: StateStore | None = None
        if config.state == "memory":
            self.params, self.optimizer_state = HostParams(dict(params)), MemoryState(self.slices)
        else:
            largest = padded_size(max(shapes.values()) * 4)
            state = max(sum(padded_size(n * dtype.itemsize) for dtype, n, _ in sl.records.values())
                        for sl in self.slices.values())
            budget, need = config.host_budget_of(largest, state), config.working_set(largest, state)
            if budget < need:
                raise ValueError(f"host_budget: {format_bytes(budget)} is less than server {index}'s working set of "
                                 f"{format_bytes(need)} (its largest bucket slice is {format_bytes(largest)}, its "
                                 f"optimizer state {format_bytes(state)}; [Note: the server's host memory])")
            self.store = StateStore(Path(config.store_root), budget)
            self.optimizer_state = TieredState(self.slices, self.store)
            self.params = (TieredParams(params, self.store, sizes=shapes)
                           if config.tier_params else HostParams(dict(params)))
        del params
        #: the updates made so far (every bucket's, kept per bucket: a bucket is updated after its gradient)
        self.adam_steps = {b: torch.tensor(0.0) for b in self.buckets}
        self.ingress_bytes: list[int] = []
        self.update_s = 0.0
        #: next step's forward sends, posted once every bucket is updated (bucket -> pendings)
        self._early: dict[int, list[Pending]] = {}
        #: gradient sums of the micro-batches of the step so far (gradient accumulation)
        self._grad_sums: dict[int, torch.Tensor] = {}

    # ---------------------------------------------------------------- state
    @property
    def optimizer_bytes(self) -> int:
        return sum(sl.nbytes() for sl in self.slices.values())

    def load_bucket(self, b: int, param: torch.Tensor, records: dict[str, torch.Tensor], adam_step: float) -> None:
        """Bucket ``b``'s slice of a checkpoint (its parameters, the records of its optimizer state and the
        updates made)."""
        self.params.get(b).copy_(param)
        self.params.release(b, dirty=True)
        self.optimizer_state.load(b, records)
        self.adam_steps[b].fill_(adam_step)

    # ----------------------------------------------------------------- step
    def _post_sends(self, b: int, phase: int, step: int) -> list[Pending]:
        param = self.params.get(b)   # one hold, released once these sends have completed
        return [self.comm.isend(param, agent, tag(Kind.PARAM, b, phase),
                                f"parameters of bucket {b} (step {step}) for worker {w}")
                for w, agent in enumerate(self.roles.agent_ranks())]

    def step(self, step: int, *, more: bool = False, keep: bool = True, apply: bool = True,
             max_grad_norm: float | None = None, norm_group=None) -> float | None:
        """One pass: send parameters, receive reduced gradients, update bucket by bucket.

        ``more``: another step follows, so its forward sends are posted (in fetch
        order) as soon as the last bucket is updated, before this call returns.
        ``keep=False``: the gradients are received and dropped (a validation pass); ``apply=False``: they are
        added to this shard's sums and the update waits for the last micro-batch (gradient accumulation).
        ``max_grad_norm``: global-norm clipping ([Note: clipping across shards]); ``norm_group`` the process
        group of the servers. Returns the gradient's global norm when clipping, else None.
        """
        comm = self.comm
        in_before, _ = comm.counters()
        eager = keep and apply and max_grad_norm is None
        # Prologue: post every parameter send of this step in fetch order. Sends complete as agents
        # post their receives; a bucket's slices are not modified until all its sends have completed.
        sends: dict[int, list[Pending]] = {}
        tiered = self.params.tiered
        fetches = self.schedule.fetch_order
        if not tiered:
            with trace.span("post param sends", track=f"server{self.index}"):
                for f in fetches:
                    early = self._early.pop(f.bucket, None) if f.phase == 0 else None
                    sends.setdefault(f.bucket, []).extend(early or self._post_sends(f.bucket, f.phase, step))
        # Tiered parameters rest on the SSD: a bucket is read in, sent, and released once its sends complete,
        # at most `send_window` buckets at a time, posted as far as the next gradient needs them.
        more = more and not tiered
        window = _SendWindow(self, fetches, step)
        order = self.schedule.grad_order
        posted: dict[int, tuple[list[Pending], list[torch.Tensor]]] = {}
        for b in order[:self.config.recv_ahead]:
            posted[b] = self._post_receives(b, step)
        if eager:
            self.optimizer_state.prefetch(order[0])
        held: list[int] = []   # buckets whose update waits for the whole gradient's norm (clipping)
        squares = torch.zeros(1, dtype=torch.float64)
        # Steady state: gradients arrive last layer first; apply each bucket's update as soon as it lands.
        for i, b in enumerate(order):
            if eager and i + 1 < len(order):
                self.optimizer_state.prefetch(order[i + 1])
            if tiered:
                # every delivery the workers need before they can send gradient b, and those of the gradient after
                # it ([Note: sends a gradient ahead])
                window.pump_for(b, order[i + 1] if i + 1 < len(order) else b)
            grad = self._receive_gradient(b, *posted.pop(b))
            # the next receives are posted once this bucket's have landed and been added up: W buffers of the
            # next bucket and this one's sum are what the gradients take while this bucket is updated (an agent
            # sends its buckets one after the other, so posting earlier would gain little)
            if i + self.config.recv_ahead < len(order):
                nxt = order[i + self.config.recv_ahead]
                posted[nxt] = self._post_receives(nxt, step)
            if tiered:
                window.drain_bucket(b)
            else:
                comm.wait_all(sends.pop(b))
            if keep:
                squares += self._take_gradient(b, grad, apply=apply, eager=eager, held=held)
            del grad
        window.drain()
        if more and eager:
            # the next step's forward deliveries, in fetch order: an agent receives them in that order, and messages
            # are matched by order ([Note: messages matched by order] in terastack.disdp.comm)
            for f in fetches:
                if f.phase == 0:
                    self._early[f.bucket] = self._post_sends(f.bucket, 0, step + 1)
        norm = self._clip_held(held, squares, max_grad_norm, norm_group) if held else None
        # Epilogue: every send of this step has completed (each bucket's were waited before its update);
        # the next step's forward sends may be in flight.
        in_after, _ = comm.counters()
        self.ingress_bytes.append(in_after - in_before)
        return norm

    def _post_receives(self, b: int, step: int) -> tuple[list[Pending], list[torch.Tensor]]:
        """The receives of bucket ``b``'s gradient: the aggregator's sum, or each worker's slice."""
        comm, roles, n = self.comm, self.roles, self.params.numel(b)
        if roles.aggregator:
            buf = [torch.empty(n)]
            return [comm.irecv(buf[0], roles.aggregator_rank, tag(Kind.AGG_GRAD, b),
                               f"reduced gradient of bucket {b} (step {step})")], buf
        bufs = [torch.empty(n) for _ in range(roles.workers)]
        return [comm.irecv(bufs[w], roles.agent_rank(w), tag(Kind.GRAD, b),
                           f"gradient of bucket {b} (step {step}) from worker {w}")
                for w in range(roles.workers)], bufs

    def _receive_gradient(self, b: int, pendings: list[Pending], bufs: list[torch.Tensor]) -> torch.Tensor:
        """Bucket ``b``'s gradient once it has landed; without the aggregator this shard reduces the workers'
        gradients itself (its ingress grows with W)."""
        with trace.span(f"wait grad b{b}", track=f"server{self.index}"):
            self.comm.wait_all(pendings)
        grad = bufs[0]
        if not self.roles.aggregator:
            for other in bufs[1:]:
                grad.add_(other)
            if self.config.mean:
                grad.div_(self.roles.workers)
        return grad

    def _take_gradient(self, b: int, grad: torch.Tensor, *, apply: bool, eager: bool, held: list[int]):
        """Add the step's earlier micro-batches' sum, then update now (eager), keep the sum (accumulation), or
        keep it for the clipped update (``held``); the squares this bucket adds to the gradient's norm."""
        earlier = self._take_kept(b)
        if earlier is not None:   # the sum of the step's earlier micro-batches (addition commutes exactly)
            grad = grad.add_(earlier)
            self._drop_kept(b)
        if not apply:
            self._keep(b, grad)
        elif eager:
            self._update(b, grad)
        else:
            self._keep(b, grad)
            held.append(b)
            return torch.linalg.vector_norm(grad).double() ** 2
        return 0.0

    def _clip_held(self, held: list[int], squares: torch.Tensor, max_grad_norm: float, norm_group) -> float:
        """[Note: clipping across shards] the clip coefficient needs the norm of the whole gradient: each shard
        adds its slices' squares (as they arrived), the servers add theirs up, and every shard scales by the same
        factor. The norm."""
        if norm_group is not None and self.roles.servers > 1:
            dist.all_reduce(squares, group=norm_group)
        total = squares.sqrt().float()
        coef = torch.clamp(max_grad_norm / (total + 1e-6), max=1.0)
        for b in held:
            self._update(b, self._take_kept(b).mul_(coef))
            self._drop_kept(b)
        return float(total)

    # [Note: gradients kept past their arrival] with gradient accumulation a bucket's sum waits for the step's last
    # micro-batch, and with clipping its update waits for the norm of the whole gradient: 4P/S bytes a shard would
    # hold. With the state on the SSD they rest there too, each read back when it is needed.
    def _keep(self, b: int, grad: torch.Tensor) -> None:
        if self.store is None or not self.params.tiered:
            self._grad_sums[b] = grad
            return
        self.store.add(f"g{b}", grad, self.comm.timeout_s)

    def _take_kept(self, b: int) -> torch.Tensor | None:
        if b in self._grad_sums:
            return self._grad_sums[b]
        if self.store is not None and f"g{b}" in self.store:
            return self.store.take(f"g{b}", self.comm.timeout_s)
        return None

    def _drop_kept(self, b: int) -> None:
        if self._grad_sums.pop(b, None) is None:
            self.store.delete(f"g{b}")

    def _update(self, b: int, grad: torch.Tensor) -> None:
        """The job's optimizer on this shard's slice of bucket ``b`` ([Note: a slice's optimizer state])."""
        t0 = time.perf_counter()
        with trace.span(f"update b{b}", track=f"server{self.index}"):
            state = self.optimizer_state.get(b, self.comm.timeout_s)
            param = self.params.get(b)
            opt = self.opt
            self.slices[b].update(param, grad, state, step=int(self.adam_steps[b]), lr=opt.lr,
                                  hyper=SimpleNamespace(betas=(opt.beta1, opt.beta2), eps=opt.eps,
                                                        weight_decay=opt.weight_decay))
            self.adam_steps[b] += 1
            self.params.release(b, dirty=True)
            self.optimizer_state.release(b)
        self.update_s += time.perf_counter() - t0

    def host_state_bytes(self) -> int:
        """The most host bytes this shard's state took: its tensors in memory, or its store's peak."""
        if self.store is None:
            return self.params.host_bytes() + self.optimizer_state.host_bytes()
        return self.store.host_bytes() + (0 if self.params.tiered else self.params.host_bytes())

    def close(self) -> None:
        self.params.close()
        self.optimizer_state.close()
        if self.store is not None:
            self.store.close()


def scratch_dir(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, f"server-{index}-store")


class _SendWindow:
    """A tiered server's parameter sends: a bucket is read in, sent, and released once its sends complete, at
    most ``send_window`` buckets at a time, posted in fetch order as far as the gradients need them."""

    def __init__(self, server: ParameterServer, fetches, step: int):
        self.server, self.fetches, self.step = server, fetches, step
        self.window: collections.deque = collections.deque()   # (bucket, pendings), oldest first
        self.last_fetch = {f.bucket: i for i, f in enumerate(fetches)}
        self.cursor = 0

    def drain_one(self) -> None:
        b0, pend = self.window.popleft()
        self.server.comm.wait_all(pend)
        self.server.params.release(b0)

    def pump(self, upto: int) -> None:
        server, fetches = self.server, self.fetches
        while self.cursor < upto:
            while len(self.window) >= server.config.send_window:
                self.drain_one()
            f = fetches[self.cursor]
            if self.cursor + 1 < len(fetches):
                server.params.prefetch(fetches[self.cursor + 1].bucket)
            self.window.append((f.bucket, server._post_sends(f.bucket, f.phase, self.step)))
            self.cursor += 1

    def pump_for(self, b: int, after: int) -> None:
        """Every delivery the workers need before they send gradient ``b``, and those before gradient ``after``."""
        self.pump(max(self.last_fetch[b], self.last_fetch[after]) + 1)

    def drain_bucket(self, b: int) -> None:
        while any(b0 == b for b0, _ in self.window):
            self.drain_one()

    def drain(self) -> None:
        while self.window:
            self.drain_one()
