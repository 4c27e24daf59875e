"""The aggregator: reduces the workers' gradients before they reach the parameter servers.

It stands in for an in-network aggregation switch: every agent sends it its
whole gradient bucket; it sums them, divides by the number of workers and
sends each server only its slice. A server's ingress per step is therefore
one gradient's worth, whatever the number of workers.
"""
from __future__ import annotations

import torch

from terastack import trace
from terastack.disdp.comm import Comm, Kind, Pending, tag
from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.roles import RoleMap


class Aggregator:

    def __init__(self, *, roles: RoleMap, comm: Comm, layout: Layout, schedule: Schedule, recv_ahead: int = 2,
                 mean: bool = True):
        """``mean``: divide the sum by the number of workers (each worker's loss is its own mean); False: send the
        sum (each worker's loss is already divided by the whole batch's target tokens, as in a job)."""
        self.roles = roles
        self.mean = mean
        self.comm = comm
        self.layout = layout
        self.schedule = schedule
        self.recv_ahead = max(1, recv_ahead)
        self.ingress_bytes: list[int] = []

    def step(self, step: int) -> None:
        comm, roles = self.comm, self.roles
        order = self.schedule.grad_order
        in_before, _ = comm.counters()
        posted: dict[int, tuple[list[Pending], torch.Tensor]] = {}

        def post(b: int) -> None:
            bufs = torch.empty(roles.workers, self.layout.buckets[b].numel)
            posted[b] = ([comm.irecv(bufs[w], roles.agent_rank(w), tag(Kind.GRAD, b),
                                     f"gradient of bucket {b} (step {step}) from worker {w}")
                          for w in range(roles.workers)], bufs)

        # Prologue: receives for the first buckets of the backward are posted ahead.
        for b in order[:self.recv_ahead]:
            post(b)
        sends: list[Pending] = []
        # Steady state: reduce bucket b while the next buckets' gradients arrive.
        for i, b in enumerate(order):
            if i + self.recv_ahead < len(order):
                post(order[i + self.recv_ahead])
            pendings, bufs = posted.pop(b)
            with trace.span(f"wait grad b{b}", track="aggregator"):
                comm.wait_all(pendings)
            with trace.span(f"reduce b{b}", track="aggregator"):
                reduced = bufs.sum(0) if roles.workers > 1 else bufs[0].clone()
                if self.mean:
                    reduced.div_(roles.workers)
            for s in range(roles.servers):
                lo, hi = self.layout.shard(b, s)
                sends.append(comm.isend(reduced[lo:hi], roles.server_rank(s), tag(Kind.AGG_GRAD, b),
                                        f"reduced gradient of bucket {b} (step {step}) for server {s}"))
        # Epilogue: every slice has reached its server before the next step reuses nothing of this one.
        comm.wait_all(sends)
        in_after, _ = comm.counters()
        self.ingress_bytes.append(in_after - in_before)
