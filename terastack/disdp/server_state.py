"""The parameter servers' state in a checkpoint: :class:`ServerState`, a ``Stateful`` component of the checkpoint
manager (:mod:`terastack.training.checkpoint`), which every disaggregated job saves and resumes through --
``terastack dist train`` (gathered by rank 0) and ``terastack dist demo`` (gathered by server 0,
:func:`save_servers` / :func:`resume_server`); the baselines hand back their final parameters the same way.

[Note: the servers' state, unsharded]
A checkpoint holds, per bucket, the whole fp32 parameters and the optimizer state's records whole (``b{i}.param``;
AdamW's ``b{i}.exp_avg`` and ``b{i}.exp_avg_sq``, another format's records: [Note: a slice's optimizer state] in
terastack.disdp.slice_state), the optimizer, its step, the buckets' names and sizes and the parameters' names
and shapes in each bucket. No server's slice is a tensor of its own, so a job resumes on any number of servers:
each reads the buckets one at a time and keeps its slice. A snapshot is written by one process, through the manager
(one snapshot directory, checksummed, ``LATEST`` moved last: [Note: checkpoint layout and atomicity] in
terastack.training.checkpoint), while the servers stream it to that process a bucket at a time, so no process
holds more than one bucket's state beside its own.
"""
from __future__ import annotations

import os

import torch

from terastack.disdp.buckets import Layout
from terastack.disdp.comm import Kind, tag
from terastack.disdp.slice_state import SliceState, bucket_records
from terastack.training.checkpoint import StreamedTensor, open_checkpoint, save_checkpoint
from terastack.training.engine_protocol import StepCount

#: the component's name in a checkpoint
COMPONENT = "servers"


def bucket_kinds(layout: Layout, b: int) -> dict[str, tuple[torch.dtype, int]]:
    """What a checkpoint holds of bucket ``b`` (name -> (dtype, elements)): its parameters, then its optimizer
    state's records whole."""
    return {"param": (torch.float32, layout.buckets[b].numel), **bucket_records(layout, b)}


def slice_regions(layout: Layout, b: int, server: int) -> dict[str, tuple[torch.dtype, int, int]]:
    """Server ``server``'s part of each of bucket ``b``'s kinds (name -> (dtype, start, end)), in the order the
    servers send them."""
    lo, hi = layout.shard(b, server)
    out = {"param": (torch.float32, lo, hi)}
    for name, (dtype, n, start) in SliceState(layout, b, server).records.items():
        out[name] = (dtype, start, start + n)
    return out


class ServerState:
    """The servers' state as a checkpoint holds it ([Note: the servers' state, unsharded]). Saving streams it
    bucket by bucket (``pull(b)``: the bucket's whole tensors by kind, asked once per bucket, in bucket order);
    ``moments`` False: the parameters alone (a baseline's result). Loading keeps the snapshot's handles, read one
    tensor at a time ([Note: what a component's state holds] in terastack.training.checkpoint)."""

    def __init__(self, layout: Layout, *, pull=None, adam_step: float = 0.0, moments: bool = True):
        self.layout = layout
        self.pull = pull
        self.adam_step = adam_step
        self.moments = moments
        self.stored: dict = {}
        self._last: tuple[int, dict] | None = None

    def _bucket(self, b: int) -> dict[str, torch.Tensor]:
        # the manager writes a bucket's tensors one after the other: pulled once, kept until the next bucket's
        if self._last is None or self._last[0] != b:
            self._last = None
            self._last = (b, self.pull(b))
        return self._last[1]

    def kinds(self, b: int) -> dict[str, tuple[torch.dtype, int]]:
        kinds = bucket_kinds(self.layout, b)
        return kinds if self.moments else {"param": kinds["param"]}

    def state_dict(self) -> dict:
        layout = self.layout.to_dict()
        out = {"buckets": [b.name for b in self.layout.buckets], "adam_step": self.adam_step,
               "optimizer": self.layout.optimizer, "numel": self.layout.numel,
               "params": [b["params"] for b in layout["buckets"]]}
        for b in range(len(self.layout.buckets)):
            for kind, (dtype, n) in self.kinds(b).items():
                out[f"b{b}.{kind}"] = StreamedTensor(shape=(n,), dtype=dtype,
                                                     pieces=lambda b=b, kind=kind: [self._bucket(b)[kind]])
        return out

    def load_state_dict(self, state: dict) -> None:
        names = [b.name for b in self.layout.buckets]
        if state.get("buckets") != names or int(state.get("numel", -1)) != self.layout.numel:
            raise ValueError("--resume: the checkpoint's model differs from this job's (other buckets or sizes)")
        saved = state.get("optimizer", "adamw")   # written before other formats were served: AdamW's
        if self.moments and any(k.startswith("b0.") and k != "b0.param" for k in state) \
                and saved != self.layout.optimizer:
            raise ValueError(f"--resume: the checkpoint holds {saved}'s optimizer state; this job's "
                             f"training.optimizer is {self.layout.optimizer}")
        missing = [f"b{b}.{k}" for b in range(len(names)) for k in self.kinds(b) if f"b{b}.{k}" not in state]
        if missing:
            raise ValueError(f"--resume: the checkpoint holds no {', '.join(missing[:3])} (it holds a model's final "
                             "parameters, not a job's state)")
        self.adam_step = float(state["adam_step"])
        self.stored = {k: v for k, v in state.items() if k.startswith("b") and "." in k}

    def read(self, b: int, kind: str) -> torch.Tensor:
        return self.stored[f"b{b}.{kind}"].read().reshape(-1)


def load_parameters(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], int]:
    """The full model's parameters (by name) of the latest checkpoint in ``path``, and its step."""
    snapshot = open_checkpoint(path)
    state = snapshot.state(COMPONENT)
    if "params" not in state:
        raise ValueError(f"checkpoint {snapshot.path}: its {COMPONENT!r} part does not name the parameters of its "
                         "buckets")
    buckets = Layout.bucket_dicts_from({"buckets": [{"name": n, "params": p}
                                                    for n, p in zip(state["buckets"], state["params"])]})
    flats = [state[f"b{b.index}.param"].read().reshape(-1) for b in buckets]
    return {k: v.clone() for k, v in Layout(buckets, 1).unflatten(flats).items()}, snapshot.step


def save_parameters(path: str | os.PathLike, layout: Layout, flats: list[torch.Tensor], step: int) -> None:
    """Write a model's final parameters (one flat fp32 vector per bucket) as a checkpoint of the servers' state
    without moments: how the workers-only baselines hand back their result."""
    state = ServerState(layout, pull=lambda b: {"param": flats[b].float()}, moments=False)
    save_checkpoint(path, {COMPONENT: state, "progress": StepCount(step)}, step=step)


# ------------------------------------------------------------ the demo's servers
def _own_bucket(server, b: int) -> dict[str, torch.Tensor]:
    """Server ``server``'s slice of bucket ``b``: its parameters and optimizer state, copied out, by kind in the
    order :func:`slice_regions` gives."""
    out = {"param": server.params.get(b).clone()}
    server.params.release(b)
    state = server.optimizer_state.get(b, server.comm.timeout_s)
    out.update({name: state[name].clone() for name in server.slices[b].records})
    server.optimizer_state.release(b)
    return out


def save_servers(server, path: str | os.PathLike, step: int, *, components: dict) -> None:
    """Every server of a demo job: the servers' state after ``step`` steps into checkpoint ``path``, written by
    server 0 with ``components`` beside it ([Note: the servers' state, unsharded]); the others send it their
    slices, bucket by bucket (a checkpoint's messages: server -> server 0)."""
    roles, layout, comm = server.roles, server.layout, server.comm
    if server.index != 0:
        for b in server.buckets:
            for kind, t in _own_bucket(server, b).items():
                comm.send(t, roles.server_rank(0), tag(Kind.CKPT, b), f"checkpoint {kind} of bucket {b}")
        server.optimizer_state.flush()
        return

    def pull(b: int) -> dict[str, torch.Tensor]:
        out = {k: torch.empty(n, dtype=dtype) for k, (dtype, n) in bucket_kinds(layout, b).items()}
        for s in range(roles.servers):
            regions = slice_regions(layout, b, s)
            if s == 0:
                for k, t in _own_bucket(server, b).items():
                    out[k][regions[k][1]:regions[k][2]] = t
                continue
            for k, (_, lo, hi) in regions.items():
                comm.recv(out[k][lo:hi], roles.server_rank(s), tag(Kind.CKPT, b),
                          f"checkpoint {k} of bucket {b} from server {s}")
        return out

    state = ServerState(layout, pull=pull, adam_step=float(server.adam_steps[server.buckets[0]].item()))
    save_checkpoint(path, {COMPONENT: state, "progress": StepCount(step), **components}, step=step)
    server.optimizer_state.flush()


def resume_server(server, path: str | os.PathLike) -> int:
    """A demo server: its slice of the servers' state from the latest checkpoint in ``path`` (any number of
    servers wrote it); returns the checkpoint's step."""
    snapshot = open_checkpoint(path)
    state, progress = ServerState(server.layout), StepCount()
    snapshot.load({COMPONENT: state, "progress": progress})
    for b in server.buckets:   # one bucket's tensors in memory at a time
        regions = slice_regions(server.layout, b, server.index)
        parts = {k: state.read(b, k)[lo:hi] for k, (_, lo, hi) in regions.items()}
        server.load_bucket(b, parts.pop("param"), parts, state.adam_step)
    server.optimizer_state.flush()
    return progress.step
