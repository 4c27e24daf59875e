"""A worker's gradient buckets leave in the schedule's gradient order even when one completes late (a parameter
that gets no gradient): messages are matched by their order ([Note: messages matched by order])."""
from __future__ import annotations

import torch
from torch import nn

from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.worker import ShardedModel

from .test_units import _LocalLink


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.spare = nn.Linear(4, 4)   # unused in the forward: its bucket is complete only at the step's end

    def forward(self, x):
        return torch.tanh(self.lin(x))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.layers = nn.ModuleList(_Block() if i == 1 else nn.Linear(4, 4) for i in range(3))
        self.head = nn.Linear(4, 8)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).logsumexp(-1).sum()


def test_gradients_leave_in_the_schedules_order():
    torch.manual_seed(0)
    reference = _Model()
    ids = torch.tensor([[1, 2, 3, 4]])
    reference(ids).backward()
    with torch.device("meta"):
        meta = _Model()
    layout = Layout.of(meta, 1)
    schedule = Schedule(layout, reshard=True)
    sharded = ShardedModel(meta, layout, schedule)
    params = dict(reference.named_parameters())
    flats = [torch.cat([params[p.name].detach().reshape(-1) for p in b.params]) for b in layout.buckets]
    sharded.link = link = _LocalLink(sharded, flats)
    sharded.begin_step(0)
    sharded.model(ids).backward()
    sharded.finish_step()
    assert list(link.grads) == schedule.grad_order   # the order the agent's receivers post in
    for b in layout.buckets:
        for p in b.params:
            want = params[p.name].grad
            got = link.grads[b.index][p.offset:p.offset + p.numel].view(p.shape)
            torch.testing.assert_close(got, torch.zeros_like(got) if want is None else want)
