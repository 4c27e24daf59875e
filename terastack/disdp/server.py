"""A parameter-server shard: fp32 master weights and AdamW moments for its key ranges, and the update.

Server ``s`` owns slice ``s`` of every bucket (:meth:`Layout.shard`). Per step
it sends its parameter slices to every agent in the schedule's fetch order,
then, as the reduced gradients arrive bucket by bucket (last layer first),
applies AdamW to each slice — overlapping the update of one bucket with the
workers' backward of the next.

The AdamW math is PyTorch's own (``torch.optim.adamw.adamw``, the
single-tensor CPU path that ``torch.optim.AdamW`` takes), so a server's update
equals single-process AdamW on the same gradients.

[Note: where the optimizer state lives]
``state="memory"``: parameters and moments are host tensors. ``state="ssd"``:
the moments (two thirds of the state) rest on SSD in a
:class:`terastack.tiers.TieredStore`; the moments of the next bucket in
gradient order are prefetched while the current bucket is updated, and each
bucket's are written back and evicted right after, so the host holds the
moments of at most two buckets. The fp32 parameters stay in host memory (they
are sent to every agent twice per step), or with ``tier_params`` rest on the
SSD too, read in for their sends and their update.

[Note: the server's host memory]
With ``state="ssd"`` parameters and moments share one tiered store whose host
budget is ``host_budget`` (a job's ``store.host_budget``). A step cannot do
without its *working set* (:meth:`ParameterServer.Config.working_set`): the
parameters of the sends in flight, the bucket being updated (parameters and
both moments), and the moments of the bucket before it while they are written
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
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

from terastack import trace
from terastack.constants import padded_size
from terastack.disdp import shard_checkpoint as ckpt
from terastack.disdp.comm import Comm, Kind, Pending, tag
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.roles import RoleMap
from terastack.tiers import Tier, TieredStore
from terastack.units import format_bytes
from terastack.training.job.engine_sections import DISDP_STATES

#: where the servers keep their state: the job's choices (one copy, in the job's disdp section)
STATES = DISDP_STATES
#: elements of a bucket's slice updated at once (AdamW's temporaries: 16 MiB)
UPDATE_CHUNK = 4 << 20


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


class _MemoryMoments:
    def __init__(self, shapes: dict[int, int]):
        self.m = {b: torch.zeros(n) for b, n in shapes.items()}
        self.v = {b: torch.zeros(n) for b, n in shapes.items()}

    def load(self, b: int, m: torch.Tensor, v: torch.Tensor) -> None:
        self.m[b].copy_(m)
        self.v[b].copy_(v)

    def prefetch(self, b: int) -> None:
        pass

    def get(self, b: int, timeout: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self.m[b], self.v[b]

    def release(self, b: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def host_bytes(self) -> int:
        return sum(t.numel() * 4 for t in (*self.m.values(), *self.v.values()))

    def close(self) -> None:
        pass


class StateStore:
    """The tiered store a server's state rests in, under one host-memory budget ([Note: the server's host
    memory]): what a bucket's update or send needs is *taken* (read in, making room first), what may be needed
    next is *read ahead* only into free room, and what was taken is *put back* (written back when modified,
    then evicted)."""

    def __init__(self, root: Path, budget: int):
        if root.exists():
            shutil.rmtree(root)   # scratch space: the durable state is in the checkpoints
        self.store = TieredStore(TieredStore.Config(root=str(root), host_budget=budget, device_budget=0))
        self.ledger = self.store.budgets[Tier.HOST]
        self._ahead: dict[str, object] = {}    # read ahead and not taken yet: name -> future
        self._writing: list = []               # write-backs under way

    def read_ahead(self, name: str) -> None:
        if name in self._ahead or self.store.resident(name, Tier.HOST) is not None:
            return
        if self.ledger.free >= self.store.padded(name):   # only into free room: never at a take's expense
            self._ahead[name] = self.store.prefetch(name, Tier.HOST)

    def take(self, name: str, timeout: float) -> torch.Tensor:
        fut = self._ahead.pop(name, None)
        if fut is None:
            if self.store.resident(name, Tier.HOST) is None:
                self._room(self.store.padded(name), timeout)
            fut = self.store.prefetch(name, Tier.HOST)
        return fut.result(timeout)

    def put_back(self, name: str, *, dirty: bool) -> None:
        if dirty:
            self.store.mark_dirty(name)
        self._writing = [f for f in self._writing if not f.done()]
        self._writing.append(self.store.evict(name))

    def _room(self, nbytes: int, timeout: float) -> None:
        """Free ``nbytes`` of the budget for a take: finish the write-backs, then drop what was read ahead."""
        if self.ledger.free >= nbytes:
            return
        for f in self._writing:
            f.result(timeout)
        self._writing.clear()
        while self.ledger.free < nbytes and self._ahead:
            name, fut = self._ahead.popitem()
            fut.result(timeout)
            self.store.evict(name).result(timeout)   # unmodified: dropped at once

    def add(self, name: str, tensor: torch.Tensor, timeout: float) -> None:
        """A new tensor resting on the SSD, written from ``tensor`` itself (no host copy)."""
        self.store.put(name, tensor, home=Tier.SSD).result(timeout)

    def __contains__(self, name: str) -> bool:
        return name in self.store

    def delete(self, name: str) -> None:
        self.store.delete(name)

    def wait(self, timeout: float) -> None:
        for f in self._writing:
            f.result(timeout)
        self._writing.clear()
        self.store.wait(timeout)

    def host_bytes(self) -> int:
        return self.ledger.peak

    def close(self) -> None:
        self.store.wait(600)
        self.store.close()


class _TieredMoments:
    """Moments resting on SSD through the server's state store ([Note: where the optimizer state lives])."""

    def __init__(self, shapes: dict[int, int], store: StateStore):
        self.store = store
        for b, n in shapes.items():
            store.store.create(f"m{b}", (n,), torch.float32, home=Tier.SSD)
            store.store.create(f"v{b}", (n,), torch.float32, home=Tier.SSD)

    def load(self, b: int, m: torch.Tensor, v: torch.Tensor) -> None:
        mm, vv = self.get(b, 600)
        mm.copy_(m)
        vv.copy_(v)
        self.release(b)

    def prefetch(self, b: int) -> None:
        self.store.read_ahead(f"m{b}")
        self.store.read_ahead(f"v{b}")

    def get(self, b: int, timeout: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self.store.take(f"m{b}", timeout), self.store.take(f"v{b}", timeout)

    def release(self, b: int) -> None:
        for name in (f"m{b}", f"v{b}"):
            self.store.put_back(name, dirty=True)

    def flush(self) -> None:
        self.store.wait(600)

    def host_bytes(self) -> int:
        return self.store.host_bytes()

    def close(self) -> None:
        pass   # the server closes its store


class _HostParams:
    """fp32 parameter slices in host memory (``state="memory"``)."""

    tiered = False

    def __init__(self, params: dict[int, torch.Tensor]):
        self.t = params

    def get(self, b: int, timeout: float = 0) -> torch.Tensor:
        return self.t[b]

    def prefetch(self, b: int) -> None:
        pass

    def release(self, b: int, *, dirty: bool = False) -> None:
        pass

    def numel(self, b: int) -> int:
        return self.t[b].numel()

    def host_bytes(self) -> int:
        return sum(t.numel() * 4 for t in self.t.values())

    def close(self) -> None:
        pass


class _TieredParams:
    """fp32 parameter slices resting on SSD through the server's state store (``state="ssd"``): a bucket's slice
    is resident only while it is being sent or updated ([Note: where the optimizer state lives]); holders count,
    and the last release writes it back (when modified) and evicts it."""

    tiered = True

    def __init__(self, params, store: StateStore, *, sizes: dict[int, int]):
        """``params``: bucket -> this shard's slice, read one bucket at a time (a mapping that makes each slice when
        asked never holds them all); ``sizes``: bucket -> the slice's elements."""
        self.store = store
        self.sizes = dict(sizes)
        for b in sizes:
            store.add(f"p{b}", params[b], 600)
        self._holds: dict[int, int] = {}

    def get(self, b: int, timeout: float = 600) -> torch.Tensor:
        self._holds[b] = self._holds.get(b, 0) + 1
        return self.store.take(f"p{b}", timeout)

    def prefetch(self, b: int) -> None:
        if self._holds.get(b, 0) == 0:
            self.store.read_ahead(f"p{b}")

    def release(self, b: int, *, dirty: bool = False) -> None:
        if dirty:
            self.store.store.mark_dirty(f"p{b}")
        self._holds[b] -= 1
        if self._holds[b] == 0:
            del self._holds[b]
            self.store.put_back(f"p{b}", dirty=False)   # marked above: a modified slice is written back

    def numel(self, b: int) -> int:
        return self.sizes[b]

    def host_bytes(self) -> int:
        return self.store.host_bytes()

    def close(self) -> None:
        pass   # the server closes its store


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

        def working_set(self, largest: int) -> int:
            """The host bytes a step cannot do without, ``largest`` the padded bytes of the largest slice: the
            parameters of the sends in flight, one bucket's parameters and moments being updated, and the
            moments of the bucket before it still being written back ([Note: the server's host memory])."""
            return ((self.send_window if self.tier_params else 0) + 1 + 2 + 2) * largest

        def host_budget_of(self, largest: int) -> int:
            """This server's host budget: the setting, or the working set (what it reads ahead then fits in the
            room the working set leaves while its largest slices are not all in use)."""
            if self.host_budget is not None:
                return self.host_budget
            return self.working_set(largest)

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
        self.store: StateStore | None = None
        if config.state == "memory":
            self.params, self.moments = _HostParams(dict(params)), _MemoryMoments(shapes)
        else:
            largest = padded_size(max(shapes.values()) * 4)
            budget = config.host_budget_of(largest)
            if budget < config.working_set(largest):
                raise ValueError(f"host_budget: {format_bytes(budget)} is less than server {index}'s working set of "
                                 f"{format_bytes(config.working_set(largest))} (its largest bucket slice is "
                                 f"{format_bytes(largest)}; [Note: the server's host memory])")
            self.store = StateStore(Path(config.store_root), budget)
            self.moments = _TieredMoments(shapes, self.store)
            self.params = (_TieredParams(params, self.store, sizes=shapes)
                           if config.tier_params else _HostParams(dict(params)))
        del params
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
        return sum(self.params.numel(b) for b in self.buckets) * 8

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        # Early sends of the next step may be in flight: they only read the parameters, as this does.
        for b in self.buckets:
            m, v = self.moments.get(b, self.comm.timeout_s)
            out[f"b{b}.param"] = self.params.get(b).clone()
            self.params.release(b)
            out[f"b{b}.exp_avg"] = m.clone()
            out[f"b{b}.exp_avg_sq"] = v.clone()
            self.moments.release(b)
        self.moments.flush()
        return out

    def load_state(self, tensors: dict[str, torch.Tensor], adam_step: float) -> None:
        for b in self.buckets:
            name = f"b{b}.param"
            if name not in tensors or tensors[name].numel() != self.params.numel(b):
                raise ValueError(f"checkpoint shard of server {self.index} does not match the model: "
                                 f"tensor {name!r} missing or of the wrong size")
            self.load_bucket(b, tensors[name], tensors[f"b{b}.exp_avg"], tensors[f"b{b}.exp_avg_sq"], adam_step)
        self.moments.flush()

    def load_bucket(self, b: int, param: torch.Tensor, m: torch.Tensor, v: torch.Tensor, adam_step: float) -> None:
        """Bucket ``b``'s slice of a checkpoint (its parameters, moments and AdamW's step)."""
        self.params.get(b).copy_(param)
        self.params.release(b, dirty=True)
        self.moments.load(b, m, v)
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
        comm, roles = self.comm, self.roles
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
        window: collections.deque = collections.deque()   # (bucket, pendings), oldest first
        last_fetch = {f.bucket: i for i, f in enumerate(fetches)}
        cursor = 0

        def drain_one() -> None:
            b0, pend = window.popleft()
            comm.wait_all(pend)
            self.params.release(b0)

        def pump(upto: int) -> None:
            nonlocal cursor
            while cursor < upto:
                while len(window) >= self.config.send_window:
                    drain_one()
                f = fetches[cursor]
                if cursor + 1 < len(fetches):
                    self.params.prefetch(fetches[cursor + 1].bucket)
                window.append((f.bucket, self._post_sends(f.bucket, f.phase, step)))
                cursor += 1

        order = self.schedule.grad_order
        posted: dict[int, tuple[list[Pending], list[torch.Tensor]]] = {}

        def post(b: int) -> None:
            n = self.params.numel(b)
            if roles.aggregator:
                buf = [torch.empty(n)]
                posted[b] = ([comm.irecv(buf[0], roles.aggregator_rank, tag(Kind.AGG_GRAD, b),
                                         f"reduced gradient of bucket {b} (step {step})")], buf)
            else:
                bufs = [torch.empty(n) for _ in range(roles.workers)]
                posted[b] = ([comm.irecv(bufs[w], roles.agent_rank(w), tag(Kind.GRAD, b),
                                         f"gradient of bucket {b} (step {step}) from worker {w}")
                              for w in range(roles.workers)], bufs)

        for b in order[:self.config.recv_ahead]:
            post(b)
        if eager:
            self.moments.prefetch(order[0])
        held: list[int] = []   # buckets whose update waits for the whole gradient's norm (clipping)
        squares = torch.zeros(1, dtype=torch.float64)
        # Steady state: gradients arrive last layer first; apply each bucket's update as soon as it lands.
        for i, b in enumerate(order):
            if eager and i + 1 < len(order):
                self.moments.prefetch(order[i + 1])
            pendings, bufs = posted.pop(b)
            if tiered:
                # every delivery the workers need before they can send gradient b, and those of the gradient after
                # it ([Note: sends a gradient ahead])
                after = order[i + 1] if i + 1 < len(order) else b
                pump(max(last_fetch[b], last_fetch[after]) + 1)
            with trace.span(f"wait grad b{b}", track=f"server{self.index}"):
                comm.wait_all(pendings)
            del pendings
            grad = bufs[0]
            if not roles.aggregator:
                # Without the aggregator this shard reduces the workers' gradients itself (ingress grows with W).
                for other in bufs[1:]:
                    grad.add_(other)
                if self.config.mean:
                    grad.div_(roles.workers)
            del bufs
            # the next receives are posted once this bucket's have landed and been added up: W buffers of the
            # next bucket and this one's sum are what the gradients take while this bucket is updated (an agent
            # sends its buckets one after the other, so posting earlier would gain little)
            if i + self.config.recv_ahead < len(order):
                post(order[i + self.config.recv_ahead])
            if tiered:
                while any(b0 == b for b0, _ in window):
                    drain_one()
            else:
                comm.wait_all(sends.pop(b))
            if not keep:
                continue
            earlier = self._take_kept(b)
            if earlier is not None:   # the sum of the step's earlier micro-batches (addition commutes exactly)
                grad = grad.add_(earlier)
                self._drop_kept(b)
            if not apply:
                self._keep(b, grad)
            elif eager:
                self._update(b, grad)
            else:
                squares += torch.linalg.vector_norm(grad).double() ** 2
                self._keep(b, grad)
                held.append(b)
            del grad
        while window:
            drain_one()
        if more and eager:
            # the next step's forward deliveries, in fetch order: an agent receives them in that order, and messages
            # are matched by order ([Note: messages matched by order] in terastack.disdp.comm)
            for f in fetches:
                if f.phase == 0:
                    self._early[f.bucket] = self._post_sends(f.bucket, 0, step + 1)
        norm = None
        if held:
            # [Note: clipping across shards] the clip coefficient needs the norm of the whole gradient: each shard
            # adds its slices' squares (as they arrived), the servers add theirs up, and every shard scales by the
            # same factor.
            if norm_group is not None and roles.servers > 1:
                dist.all_reduce(squares, group=norm_group)
            total = squares.sqrt().float()
            coef = torch.clamp(max_grad_norm / (total + 1e-6), max=1.0)
            for b in held:
                self._update(b, self._take_kept(b).mul_(coef))
                self._drop_kept(b)
            norm = float(total)
        # Epilogue: every send of this step has completed (each bucket's were waited before its update);
        # the next step's forward sends may be in flight.
        in_after, _ = comm.counters()
        self.ingress_bytes.append(in_after - in_before)
        return norm

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
        """AdamW on this shard's slice of bucket ``b``."""
        t0 = time.perf_counter()
        with trace.span(f"adamw b{b}", track=f"server{self.index}"):
            m, v = self.moments.get(b, self.comm.timeout_s)
            param = self.params.get(b)
            # AdamW is elementwise: applied a chunk at a time, its temporaries are a chunk's, not the bucket's
            # (each chunk counts the step from the same value; the bucket's step moves once)
            step = chunk_step = self.adam_steps[b]
            for lo in range(0, param.numel(), UPDATE_CHUNK):
                hi = min(lo + UPDATE_CHUNK, param.numel())
                chunk_step = step.clone()
                adamw([param[lo:hi]], [grad[lo:hi]], [m[lo:hi]], [v[lo:hi]], [], [chunk_step], foreach=False,
                      amsgrad=False, beta1=self.opt.beta1, beta2=self.opt.beta2, lr=self.opt.lr,
                      weight_decay=self.opt.weight_decay, eps=self.opt.eps, maximize=False)
            step.copy_(chunk_step)
            self.params.release(b, dirty=True)
            self.moments.release(b)
        self.update_s += time.perf_counter() - t0

    # ----------------------------------------------------------- checkpoint
    def checkpoint(self, root: str, step: int, *, extra: dict) -> None:
        """Write this shard of the state after ``step`` steps; server 0 indexes it once all shards are durable."""
        with trace.span(f"checkpoint step {step}", track=f"server{self.index}"):
            ckpt.write_shard(root, step, self.index, self.state_dict(),
                             {"adam_step": float(self.adam_steps[0].item())})
            done = torch.tensor([step], dtype=torch.int64)
            if self.index == 0:
                for s in range(1, self.roles.servers):
                    got = self.comm.recv(torch.zeros(1, dtype=torch.int64), self.roles.server_rank(s),
                                         tag(Kind.CKPT, 0), f"checkpoint confirmation of step {step}")
                    if int(got.item()) != step:
                        raise RuntimeError(f"server {s} confirmed checkpoint step {int(got.item())}, expected {step}")
                ckpt.commit_index(root, step, self.layout, extra)
            else:
                self.comm.send(done, self.roles.server_rank(0), tag(Kind.CKPT, 0),
                               f"checkpoint confirmation of step {step}")

    def resume(self, root: str, index: dict) -> None:
        if int(index["servers"]) != self.roles.servers or index["fingerprint"] != self.layout.fingerprint():
            raise ValueError(f"checkpoint in {root} was written by {index['servers']} servers for a different "
                             "model layout; resume with the same model and --servers")
        tensors, meta = ckpt.read_shard(root, index, self.index)
        self.load_state(tensors, float(meta.get("adam_step", index["step"])))

    def host_state_bytes(self) -> int:
        """The most host bytes this shard's state took: its tensors in memory, or its store's peak."""
        if self.store is None:
            return self.params.host_bytes() + self.moments.host_bytes()
        return self.store.host_bytes() + (0 if self.params.tiered else self.params.host_bytes())

    def close(self) -> None:
        self.params.close()
        self.moments.close()
        if self.store is not None:
            self.store.close()


def scratch_dir(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, f"server-{index}-store")
