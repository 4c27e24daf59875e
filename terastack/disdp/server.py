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

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
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


class ParameterServer:
    """One shard of the parameter server."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        state: str = "memory"
        #: scratch directory for ``state="ssd"``
        store_root: str = ""
        #: gradient buckets whose receives are posted ahead of the one being applied
        recv_ahead: int = 2

        def __post_init__(self) -> None:
            if self.state not in STATES:
                raise ValueError(f"state: must be one of {', '.join(STATES)}; got {self.state!r}")
            if self.state == "ssd" and not self.store_root:
                raise ValueError("store_root: a directory is required for state='ssd'")
            if self.recv_ahead < 1:
                raise ValueError(f"recv_ahead: must be >= 1, got {self.recv_ahead}")

    def __init__(self, config: "ParameterServer.Config", *, index: int, roles: RoleMap, comm: Comm,
                 layout: Layout, schedule: Schedule, adamw_config: AdamWConfig, initial: list[torch.Tensor]):
        """``initial``: the full flat fp32 vector of every bucket (only this server's slices are kept)."""
        self.config = config
        self.index = index
        self.roles = roles
        self.comm = comm
        self.layout = layout
        self.schedule = schedule
        self.opt = adamw_config
        self.params: dict[int, torch.Tensor] = {}
        for b in range(len(layout.buckets)):
            lo, hi = layout.shard(b, index)
            self.params[b] = initial[b][lo:hi].clone()
        shapes = {b: p.numel() for b, p in self.params.items()}
        self.moments = (_MemoryMoments(shapes) if config.state == "memory"
                        else _TieredMoments(shapes, Path(config.store_root)))
        self.adam_steps = {b: torch.tensor(0.0) for b in self.params}
        self.ingress_bytes: list[int] = []
        self.update_s = 0.0
        #: next step's forward sends, posted as soon as each bucket is updated (bucket -> pendings)
        self._early: dict[int, list[Pending]] = {}

    # ---------------------------------------------------------------- state
    @property
    def optimizer_bytes(self) -> int:
        return sum(p.numel() for p in self.params.values()) * 8

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        # Early sends of the next step may be in flight: they only read the parameters, as this does.
        for b in self.params:
            m, v = self.moments.get(b, self.comm.timeout_s)
            out[f"b{b}.param"] = self.params[b]
            out[f"b{b}.exp_avg"] = m.clone()
            out[f"b{b}.exp_avg_sq"] = v.clone()
            self.moments.release(b)
        self.moments.flush()
        return out

    def load_state(self, tensors: dict[str, torch.Tensor], adam_step: float) -> None:
        for b in self.params:
            name = f"b{b}.param"
            if name not in tensors or tensors[name].numel() != self.params[b].numel():
                raise ValueError(f"checkpoint shard of server {self.index} does not match the model: "
                                 f"tensor {name!r} missing or of the wrong size")
            self.params[b].copy_(tensors[name])
            self.moments.load(b, tensors[f"b{b}.exp_avg"], tensors[f"b{b}.exp_avg_sq"])
            self.adam_steps[b].fill_(adam_step)
        self.moments.flush()

    # ----------------------------------------------------------------- step
    def _post_sends(self, b: int, phase: int, step: int) -> list[Pending]:
        return [self.comm.isend(self.params[b], agent, tag(Kind.PARAM, b, phase),
                                f"parameters of bucket {b} (step {step}) for worker {w}")
                for w, agent in enumerate(self.roles.agent_ranks())]

    def step(self, step: int, *, more: bool = False) -> None:
        """One training step: send parameters, receive reduced gradients, update bucket by bucket.

        ``more``: another step follows, so each bucket's forward sends for it are
        posted as soon as the bucket is updated (the next step's first deliveries
        then wait only for the last bucket's update).
        """
        comm, roles = self.comm, self.roles
        in_before, _ = comm.counters()
        # Prologue: post every parameter send of this step in fetch order. Sends complete as agents
        # post their receives; a bucket's slices are not modified until all its sends have completed.
        sends: dict[int, list[Pending]] = {}
        with trace.span("post param sends", track=f"server{self.index}"):
            for f in self.schedule.fetch_order:
                early = self._early.pop(f.bucket, None) if f.phase == 0 else None
                sends.setdefault(f.bucket, []).extend(early or self._post_sends(f.bucket, f.phase, step))
        order = self.schedule.grad_order
        posted: dict[int, tuple[list[Pending], list[torch.Tensor]]] = {}

        def post(b: int) -> None:
            n = self.params[b].numel()
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
        self.moments.prefetch(order[0])
        # Steady state: gradients arrive last layer first; apply each bucket's update as soon as it lands.
        for i, b in enumerate(order):
            if i + self.config.recv_ahead < len(order):
                post(order[i + self.config.recv_ahead])
            if i + 1 < len(order):
                self.moments.prefetch(order[i + 1])
            pendings, bufs = posted.pop(b)
            with trace.span(f"wait grad b{b}", track=f"server{self.index}"):
                comm.wait_all(pendings)
            if roles.aggregator:
                grad = bufs[0]
            else:
                # Without the aggregator this shard reduces the workers' gradients itself (ingress grows with W).
                grad = bufs[0]
                for other in bufs[1:]:
                    grad.add_(other)
                grad.div_(roles.workers)
            comm.wait_all(sends.pop(b))
            t0 = time.perf_counter()
            with trace.span(f"adamw b{b}", track=f"server{self.index}"):
                m, v = self.moments.get(b, comm.timeout_s)
                adamw([self.params[b]], [grad], [m], [v], [], [self.adam_steps[b]], foreach=False,
                      amsgrad=False, beta1=self.opt.beta1, beta2=self.opt.beta2, lr=self.opt.lr,
                      weight_decay=self.opt.weight_decay, eps=self.opt.eps, maximize=False)
                self.moments.release(b)
            self.update_s += time.perf_counter() - t0
            if more:
                self._early[b] = self._post_sends(b, 0, step + 1)
        # Epilogue: every send of this step has completed (each bucket's were waited before its update);
        # the next step's forward sends may be in flight.
        in_after, _ = comm.counters()
        self.ingress_bytes.append(in_after - in_before)

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
        self.moments.close()


def scratch_dir(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, f"server-{index}-store")
