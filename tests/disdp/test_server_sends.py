"""[Note: sends a gradient ahead]: with tiered parameters a server posts the deliveries the workers need before
their next gradient before it waits for the current one (a worker's backward never waits for an update)."""
from __future__ import annotations

from torch import nn

from terastack.disdp.buckets import Layout, Schedule
from terastack.disdp.comm import Kind
from terastack.disdp.roles import RoleMap
from terastack.disdp.server import AdamWConfig, ParameterServer


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
        self.head = nn.Linear(4, 8)


class _Work:
    def __init__(self, what):
        self.what = what


class _RecordingComm:
    """Completes every operation at once and records what the server posted and waited for, in order."""
    timeout_s = 60.0

    def __init__(self):
        self.events: list[tuple] = []

    def isend(self, tensor, dst, tg, what):
        kind, rest = divmod(tg, 1_000_000)
        phase, bucket = divmod(rest, 100_000)
        self.events.append(("send", bucket, phase))
        return _Work(None)

    def irecv(self, tensor, src, tg, what):
        tensor.zero_()
        return _Work(("grad", tg % 100_000) if tg // 1_000_000 == Kind.GRAD else None)

    def wait_all(self, pendings, timeout_s=None):
        for p in pendings:
            if p.what is not None:
                self.events.append(("wait", *p.what))

    def counters(self):
        return 0, 0


def test_the_next_gradients_deliveries_are_posted_before_the_server_waits(tmp_path):
    model = _Model()
    layout = Layout.of(model, 1)
    schedule = Schedule(layout, reshard=True)
    comm = _RecordingComm()
    server = ParameterServer(
        ParameterServer.Config(state="ssd", store_root=str(tmp_path / "store"), tier_params=True, send_window=1,
                               recv_ahead=1, mean=False),
        index=0, roles=RoleMap(workers=1, servers=1, aggregator=False), comm=comm, layout=layout,
        schedule=schedule, adamw_config=AdamWConfig(lr=0.1),
        initial=layout.flatten(dict(model.named_parameters())))
    try:
        server.step(0)
    finally:
        server.close()
    sends = [(b, p) for kind, b, p in comm.events if kind == "send"]
    assert sends == [(f.bucket, f.phase) for f in schedule.fetch_order]   # the order the agents receive in
    order = schedule.grad_order
    last = {f.bucket: i for i, f in enumerate(schedule.fetch_order)}
    for i, b in enumerate(order[:-1]):
        waited = comm.events.index(("wait", "grad", b))
        posted = sum(1 for e in comm.events[:waited] if e[0] == "send")
        # every delivery before the *next* gradient is on its way before this gradient is waited for
        assert posted >= max(last[b], last[order[i + 1]]) + 1, (b, posted, comm.events)
