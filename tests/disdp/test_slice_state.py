"""A parameter server updates its slice with the job's optimizer format, and the slices of every server together
equal the reference library on the whole parameters: torch.optim.AdamW, bitsandbytes' AdamW8bit (state bytes and
block scales too), torch.optim.Adafactor. A bucket is cut where the format can cut a parameter, and its records
laid end to end over the servers are the bucket's whole ([Note: a slice's optimizer state])."""
from types import SimpleNamespace

import pytest
import torch

from terastack.disdp.buckets import Bucket, Layout, ParamSlot
from terastack.disdp.slice_state import SliceState, bucket_records

LR, WD, STEPS = 1e-2, 0.01, 3
#: a bucket as a layer's: a matrix over two 8-bit blocks' worth of rows, a vector under min_8bit_size, another matrix
SHAPES = {"a.weight": (40, 130), "a.norm": (130,), "b.weight": (64, 80)}


def bucket() -> Bucket:
    slots, offset = [], 0
    for name, shape in SHAPES.items():
        numel = torch.Size(shape).numel()
        slots.append(ParamSlot(name, shape, offset, numel))
        offset += numel
    return Bucket(0, "model.layers.0", tuple(slots))


def reference(optimizer: str, params: dict):
    ps = list(params.values())
    if optimizer == "adamw":
        return torch.optim.AdamW(ps, lr=LR, weight_decay=WD, foreach=False)
    if optimizer == "adafactor":
        return torch.optim.Adafactor(ps, lr=LR, weight_decay=WD, foreach=False)
    bnb = pytest.importorskip("bitsandbytes")
    return bnb.optim.AdamW8bit(ps, lr=LR, weight_decay=WD)


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit", "adafactor"])
def test_three_servers_slices_equal_the_library_on_the_whole_parameters(optimizer):
    layout = Layout([bucket()], 3, optimizer=optimizer)
    n = layout.buckets[0].numel
    cuts = [layout.shard(0, s) for s in range(3)]
    assert cuts[0][0] == 0 and cuts[-1][1] == n and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    if optimizer == "adamw8bit":   # cut on an 8-bit block of a.weight, not at the even share
        assert cuts[0][1] % 256 == 0 and cuts[0][1] != n // 3
    if optimizer == "adafactor":   # between parameters
        assert {c[1] for c in cuts[:-1]} <= {s.offset for s in layout.buckets[0].params} | {n}
    g = torch.Generator().manual_seed(0)
    start = torch.randn(n, generator=g)
    ref = {s.name: torch.nn.Parameter(start[s.offset:s.offset + s.numel].view(s.shape).clone())
           for s in layout.buckets[0].params}
    opt = reference(optimizer, ref)
    slices = [SliceState(layout, 0, s) for s in range(3)]
    params = [start[lo:hi].clone() for lo, hi in cuts]
    states = [sl.zeros() for sl in slices]
    hyper = SimpleNamespace(betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    for step in range(STEPS):
        grad = torch.randn(n, generator=g)
        for slot in layout.buckets[0].params:
            ref[slot.name].grad = grad[slot.offset:slot.offset + slot.numel].view(slot.shape).clone()
        opt.step()
        for sl, p, st, (lo, hi) in zip(slices, params, states, cuts):
            sl.update(p, grad[lo:hi], st, step=step, lr=LR, hyper=hyper)
    assert torch.equal(torch.cat(params), torch.cat([p.detach().reshape(-1) for p in ref.values()]))
    # the records end to end are the bucket's records: every parameter's state whole, in the bucket's order
    whole = bucket_records(layout, 0)
    for name, (dtype, numel) in whole.items():
        joined = torch.cat([st[name] for st in states if name in st])
        assert joined.dtype == dtype and joined.numel() == numel
        at = 0
        for slot in layout.buckets[0].params:
            for key, value in opt.state[ref[slot.name]].items():
                if key in ("step", "qmap1", "qmap2") or not _is_record(key, value, name):
                    continue
                assert torch.equal(joined[at:at + value.numel()], value.reshape(-1)), (slot.name, name)
                at += value.numel()
        assert at == numel, name


def _is_record(key: str, value: torch.Tensor, name: str) -> bool:
    """Whether the library's state ``key`` lies in record ``name`` (a record is named by key and, but for fp32, by
    dtype)."""
    return name == (key if value.dtype == torch.float32 else f"{key}.{str(value.dtype).removeprefix('torch.')}")


def test_a_checkpoint_of_8bit_records_resumes_on_another_number_of_servers(tmp_path):
    """The bucket's records whole in a checkpoint (uint8 moments, fp32 block scales, a small parameter's fp32
    moments); each of two servers reads back its part of each, as three servers' slices wrote them; a job
    with another optimizer is refused by name."""
    pytest.importorskip("bitsandbytes")
    from terastack.disdp.comm import Comm
    from terastack.disdp.roles import RoleMap
    from terastack.disdp.buckets import Schedule
    from terastack.disdp.server import AdamWConfig, ParameterServer
    from terastack.disdp.server_state import ServerState, bucket_kinds, resume_server, slice_regions
    from terastack.training.checkpoint import save_checkpoint
    from terastack.training.engine_protocol import StepCount

    three = Layout([bucket()], 3, optimizer="adamw8bit")
    g = torch.Generator().manual_seed(2)
    whole = {k: (torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8) if dtype == torch.uint8 else
                 torch.randn(n, generator=g)) for k, (dtype, n) in bucket_kinds(three, 0).items()}
    assert set(whole) == {"param", "state1.uint8", "state2.uint8", "absmax1", "absmax2", "state1", "state2"}
    save_checkpoint(tmp_path, {"servers": ServerState(three, pull=lambda b: whole, adam_step=3.0),
                               "progress": StepCount(3)}, step=3)
    two = Layout([bucket()], 2, optimizer="adamw8bit")
    roles = RoleMap(workers=1, servers=2)
    for s in range(2):
        server = ParameterServer(ParameterServer.Config(state="memory", store_root=""), index=s, roles=roles,
                                 comm=Comm(roles, roles.server_rank(s), timeout_s=1.0), layout=two,
                                 schedule=Schedule(two, reshard=True), adamw_config=AdamWConfig(),
                                 initial=[torch.zeros(two.buckets[0].numel)])
        assert resume_server(server, tmp_path) == 3 and float(server.adam_steps[0]) == 3.0
        state = server.optimizer_state.get(0, 1.0)
        for k, (_, lo, hi) in slice_regions(two, 0, s).items():
            assert torch.equal(server.params.get(0) if k == "param" else state[k], whole[k][lo:hi]), (s, k)
    other = ParameterServer(ParameterServer.Config(state="memory", store_root=""), index=0, roles=roles,
                            comm=Comm(roles, roles.server_rank(0), timeout_s=1.0),
                            layout=Layout([bucket()], 2, optimizer="adafactor"),
                            schedule=Schedule(two, reshard=True), adamw_config=AdamWConfig(),
                            initial=[torch.zeros(two.buckets[0].numel)])
    with pytest.raises(ValueError, match="holds adamw8bit's optimizer state; this job's training.optimizer is adafactor"):
        resume_server(other, tmp_path)
