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
moments of at most two buckets. The fp32 parameters stay in host memory: they
are sent to every agent twice per step.
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

STATES = ("memory", "ssd")


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


class _TieredMoments:
    """Moments resting on SSD through the tiered store ([Note: where the optimizer state lives])."""

    def __init__(self, shapes: dict[int, int], root: Path):
        if root.exists():
            shutil.rmtree(root)   # scratch space: the durable state is in the checkpoints
        biggest = max(shapes.values())
        # Two buckets' moments resident (current + prefetched) plus up to two being written back.
        budget = 4 * 2 * padded_size(biggest * 4)
        self.store = TieredStore(TieredStore.Config(root=str(root), host_budget=budget, device_budget=0))
        for b, n in shapes.items():
            self.store.create(f"m{b}", (n,), torch.float32, home=Tier.SSD)
            self.store.create(f"v{b}", (n,), torch.float32, home=Tier.SSD)
        self._pending: dict[int, tuple] = {}

    def load(self, b: int, m: torch.Tensor, v: torch.Tensor) -> None:
        mm, vv = self.get(b, 600)
        mm.copy_(m)
        vv.copy_(v)
        self.release(b)

    def prefetch(self, b: int) -> None:
        if b not in self._pending:
            self._pending[b] = (self.store.prefetch(f"m{b}", Tier.HOST), self.store.prefetch(f"v{b}", Tier.HOST))

    def get(self, b: int, timeout: float) -> tuple[torch.Tensor, torch.Tensor]:
        self.prefetch(b)
        fm, fv = self._pending.pop(b)
        return fm.result(timeout), fv.result(timeout)

    def release(self, b: int) -> None:
        for name in (f"m{b}", f"v{b}"):
            self.store.mark_dirty(name)
            self.store.evict(name)

    def flush(self) -> None:
        self.store.wait(600)

    def host_bytes(self) -> int:
        return self.store.budgets[Tier.HOST].peak

    def close(self) -> None:
        self.store.close()


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
    """fp32 parameter slices resting on SSD through the tiered store (``state="ssd"``): a bucket's slice is
    resident only while it is being sent or updated ([Note: where the optimizer state lives]); holders count,
    and the last release writes it back (when modified) and evicts it."""

    tiered = True

    def __init__(self, params, root: Path, *, window: int, sizes: dict[int, int]):
        """``params``: bucket -> this shard's slice, read one bucket at a time (a mapping that makes each slice when
        asked never holds them all); ``sizes``: bucket -> the slice's elements."""
        # the send window, the bucket being updated, one prefetched, and one being written back
        budget = (window + 3) * padded_size(max(sizes.values()) * 4)
        if root.exists():
            shutil.rmtree(root)   # scratch space: the durable state is in the checkpoints
        self.store = TieredStore(TieredStore.Config(root=str(root), host_budget=budget, device_budget=0))
        self.sizes = dict(sizes)
        for b in sizes:
            self.store.put(f"p{b}", params[b], home=Tier.SSD).result(600)
        self._holds: dict[int, int] = {}

    def get(self, b: int, timeout: float = 600) -> torch.Tensor:
        self._holds[b] = self._holds.get(b, 0) + 1
        return self.store.prefetch(f"p{b}", Tier.HOST).result(timeout)

    def prefetch(self, b: int) -> None:
        if self._holds.get(b, 0) == 0:
            self.store.prefetch(f"p{b}", Tier.HOST)

    def release(self, b: int, *, dirty: bool = False) -> None:
        if dirty:
            self.store.mark_dirty(f"p{b}")
        self._holds[b] -= 1
        if self._holds[b] == 0:
            del self._holds[b]
            done = self.store.evict(f"p{b}")
            if dirty:   # one write-back at a time: the budget counts one
                done.result(600)

    def numel(self, b: int) -> int:
        return self.sizes[b]

    def host_bytes(self) -> int:
        return self.store.budgets[Tier.HOST].peak

    def close(self) -> None:
        self.store.wait(600)
        self.store.close()


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
        if config.state == "memory":
            self.params, self.moments = _HostParams(dict(params)), _MemoryMoments(shapes)
        else:
            self.moments = _TieredMoments(shapes, Path(config.store_root))
            self.params = (_TieredParams(params, Path(config.store_root + "-params"), window=config.send_window,
                                         sizes=shapes)
                           if config.tier_params else _HostParams(dict(params)))
        del params
        self.adam_steps = {b: torch.tensor(0.0) for b in self.buckets}
        self.ingress_bytes: list[int] = []
        self.update_s = 0.0
        #: next step's forward sends, posted as soon as each bucket is updated (bucket -> pendings)
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

        ``more``: another step follows, so each bucket's forward sends for it are
        posted as soon as the bucket is updated (the next step's first deliveries
        then wait only for the last bucket's update).
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
        held: list[tuple[int, torch.Tensor]] = []
        # Steady state: gradients arrive last layer first; apply each bucket's update as soon as it lands.
        for i, b in enumerate(order):
            if i + self.config.recv_ahead < len(order):
                post(order[i + self.config.recv_ahead])
            if eager and i + 1 < len(order):
                self.moments.prefetch(order[i + 1])
            pendings, bufs = posted.pop(b)
            if tiered:
                pump(last_fetch[b] + 1)   # every delivery the workers need before they can send gradient b
            with trace.span(f"wait grad b{b}", track=f"server{self.index}"):
                comm.wait_all(pendings)
            grad = bufs[0]
            if not roles.aggregator:
                # Without the aggregator this shard reduces the workers' gradients itself (ingress grows with W).
                for other in bufs[1:]:
                    grad.add_(other)
                if self.config.mean:
                    grad.div_(roles.workers)
            if tiered:
                while any(b0 == b for b0, _ in window):
                    drain_one()
            else:
                comm.wait_all(sends.pop(b))
            if not keep:
                continue
            if b in self._grad_sums:
                grad = self._grad_sums.pop(b).add_(grad)
            if not apply:
                self._grad_sums[b] = grad
            elif eager:
                self._update(b, grad)
                if more:
                    self._early[b] = self._post_sends(b, 0, step + 1)
            else:
                held.append((b, grad))
        while window:
            drain_one()
        norm = None
        if held:
            # [Note: clipping across shards] the clip coefficient needs the norm of the whole gradient: each shard
            # adds its slices' squares, the servers add theirs up, and every shard scales by the same factor.
            squares = torch.zeros(1, dtype=torch.float64)
            for _, g in held:
                squares += torch.linalg.vector_norm(g).double() ** 2
            if norm_group is not None and roles.servers > 1:
                dist.all_reduce(squares, group=norm_group)
            total = squares.sqrt().float()
            coef = torch.clamp(max_grad_norm / (total + 1e-6), max=1.0)
            for b, g in held:
                self._update(b, g.mul_(coef))
            norm = float(total)
        # Epilogue: every send of this step has completed (each bucket's were waited before its update);
        # the next step's forward sends may be in flight.
        in_after, _ = comm.counters()
        self.ingress_bytes.append(in_after - in_before)
        return norm

    def _update(self, b: int, grad: torch.Tensor) -> None:
        """AdamW on this shard's slice of bucket ``b``."""
        t0 = time.perf_counter()
        with trace.span(f"adamw b{b}", track=f"server{self.index}"):
            m, v = self.moments.get(b, self.comm.timeout_s)
            adamw([self.params.get(b)], [grad], [m], [v], [], [self.adam_steps[b]], foreach=False,
                  amsgrad=False, beta1=self.opt.beta1, beta2=self.opt.beta2, lr=self.opt.lr,
                  weight_decay=self.opt.weight_decay, eps=self.opt.eps, maximize=False)
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

    def close(self) -> None:
        self.params.close()
        self.moments.close()


def scratch_dir(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, f"server-{index}-store")
