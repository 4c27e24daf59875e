"""Where a run's training state lives: its scratch directories, and the store records of each tensor.

A run gets a fresh ``run-PID-XXXXXXXX`` subdirectory in every directory of
``TrainerConfig.store_dir`` (one directory, or several -- one per SSD -- given
as a list or comma-separated); the store's root is those subdirectories as one
comma-separated string, the first holding the store's manifest. Record names
are :mod:`terastack.llm.engine.records`'; which records a tensor has depends on the
compute dtype and the optimizer chunk (the runtime's [Note: optimizer
chunks]) and where they rest on the plan.
"""
from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from terastack.disk_room import check_writable, free_on
from terastack.llm.engine import records
from terastack.plan.optimizer_formats import optimizer_format
from terastack.tiers import Tier
from terastack.training.hf import nf4
from terastack.units import format_bytes

#: initial weights in flight to the SSD at once while the store is filled
FILL_IN_FLIGHT = 256 << 20


# ----------------------------------------------------------- directories
def split_store_dirs(store_dir: str | Sequence[str]) -> list[str]:
    """The directories of a ``store_dir`` value: a list, or one string with commas between directories."""
    parts = store_dir.split(",") if isinstance(store_dir, str) else [str(d) for d in store_dir]
    parts = [p.strip() for p in parts]
    if not parts or not all(parts):
        raise ValueError(f"store_dir: {store_dir!r} names an empty directory")
    return parts


def make_run_dirs(store_dir: str | Sequence[str], ssd_bytes: int) -> list[Path]:
    """A fresh run subdirectory in each store directory, after checking that they are writable and that their
    file systems have room for ``ssd_bytes`` together."""
    name = f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    made: list[Path] = []
    try:
        for root in map(Path, split_store_dirs(store_dir)):
            made.append(_make_run_dir(root, name))
        free = free_on(made)  # two directories on one file system share its free space ([Note: room to write])
        if free < ssd_bytes:
            roots = ", ".join(str(d.parent) for d in made)
            raise OSError(28, f"store_dir {roots} has {format_bytes(free)} free; the plan keeps up to "
                              f"{format_bytes(ssd_bytes)} of training state there")
    except BaseException:
        remove_run_dirs(made)
        raise
    return made


def _make_run_dir(root: Path, name: str) -> Path:
    # The store directory itself may be new, but not its parent: a mistyped mount point (/mnt/nvme1/run for
    # /mnt/nvme0/run) would otherwise put the training state on whatever disk holds /mnt, silently.
    parent = root.absolute().parent
    if not root.exists() and not parent.exists():
        raise FileNotFoundError(f"store directory {root}: its parent {parent} does not exist (a mistyped mount "
                                "point?); create it, or give a directory whose parent exists")
    try:
        root.mkdir(exist_ok=True)
        run_dir = root / name
        run_dir.mkdir()
    except OSError as exc:
        raise PermissionError(f"store_dir {root} is not usable: {exc.strerror or exc}") from None
    try:
        check_writable(run_dir, what="store_dir")
    except PermissionError:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir


def store_root(run_dirs: Sequence[Path]) -> str:
    """The store's root for ``run_dirs``: one string, comma-separated (the first directory holds the manifest)."""
    return ",".join(str(d) for d in run_dirs)


def remove_run_dirs(run_dirs: Sequence[Path]) -> None:
    for run_dir in run_dirs:
        shutil.rmtree(run_dir, ignore_errors=True)


def ssd_bytes_needed(profile, plan) -> int:
    """SSD bytes the plan may keep: every record gets an SSD extent at the latest when it is first written back
    or committed, plus activations swapped to the SSD."""
    cb = profile.compute_bytes
    # a gradient goes to the SSD only where the schedule has no back-pressure (the step waits for all of them)
    schedule = plan.schedule
    fmt = optimizer_format(plan.optimizer)  # the format's state beside each fp32 master
    need = 0
    for name, n in profile.tensor_numel.items():
        if profile.tensor_trainable[name]:
            need += (n * 4 + fmt.state_bytes(profile.shape(name), full_width=profile.full_width_state(name))
                     + (n * cb if profile.mixed_precision else 0)
                     + schedule.spill_room(n * 4))
            if plan.sums_gradients and plan.grad_home.get(name) is not Tier.HOST:
                need += n * 4  # its sum over the micro-batches ([Note: gradient accumulation])
        else:
            need += profile.frozen_bytes(name)
    # activations of one pass (vertical accumulation: all micro-batches of the step at once)
    passing = plan.accumulation_spec.step_profile(profile, plan.grad_accum)
    need += sum(spec.ssd_bytes(u) for u, spec in zip(passing.units, plan.activation_specs()))
    return need


# --------------------------------------------------------------- records
class RecordSpec(NamedTuple):
    """One store record of a tensor: its dtype, home tier, shape, and the flat range of the tensor it holds
    (None: the whole tensor)."""

    record: str
    dtype: torch.dtype
    home: Tier
    shape: tuple
    span: tuple[int, int] | None


def records_for(rt, name: str) -> list[RecordSpec]:
    """Every record of parameter ``name`` under runtime ``rt``'s plan, masters first, then the optimizer state
    (``span``: for a state part, the range of the part's own elements)."""
    info = rt.tensors[name]
    plan = rt.plan
    if not info.trainable:
        return [compute_spec(rt, name)]
    home = plan.state_home[name]
    ranges = rt.chunk_ranges(name)
    if rt.master_is_compute:
        out = [RecordSpec(records.master(name), torch.float32, home, info.shape, None)]
    else:
        out = [RecordSpec(r, torch.float32, home, (hi - lo,), (lo, hi))
               for r, (lo, hi) in zip(rt.master_records(name), ranges)]
        out.append(compute_spec(rt, name))
    for part, recs in rt.state_parts(name).items():  # the optimizer format's state ([Note: optimizer state formats])
        if not part.chunked:
            out.append(RecordSpec(recs[0], part.dtype, home, part.shape(info.shape), None))
            continue
        for r, (lo, hi) in zip(recs, ranges):
            a, b = part.span(lo, hi)
            out.append(RecordSpec(r, part.dtype, home, (b - a,), (a, b)))
    return out


def compute_spec(rt, name: str) -> RecordSpec:
    """The record of parameter ``name``'s compute weights (a frozen NF4 weight's: its NF4 bytes, [Note: the NF4
    record] in terastack.training.hf.nf4)."""
    info = rt.tensors[name]
    if info.nf4:
        return RecordSpec(rt.compute_record(name), torch.uint8, rt.plan.compute_home[name],
                          (nf4.nf4_bytes(info.numel),), None)
    return RecordSpec(rt.compute_record(name), rt.compute_dtype, rt.plan.compute_home[name], info.shape, None)


class InitialWrites:
    """The initial weights on their way to the SSD while the store is filled: at most ``limit`` bytes at once, or
    the one record being written ([Note: the fill within the budget] in terastack.llm.weight_fill)."""

    def __init__(self, rt, limit: int = FILL_IN_FLIGHT):
        self.rt = rt
        self.limit = limit
        self._writes: list = []  # (future, bytes)

    def add(self, fut, nbytes: int, name: str) -> None:
        self._writes.append((fut, nbytes))
        while self._writes and sum(n for _, n in self._writes) > self.limit:
            done, _ = self._writes.pop(0)
            self.rt.wait(done, f"initial weights of {name!r} reaching the SSD")

    def finish(self) -> None:
        while self._writes:
            fut, _ = self._writes.pop(0)
            self.rt.wait(fut, "initial weights reaching the SSD")


def put_initial(rt, name: str, tensor: torch.Tensor, writes: InitialWrites) -> None:
    """Write parameter ``name``'s initial weights into every record of it (zero optimizer state), within
    ``writes``' bound on the bytes in flight."""
    info = rt.tensors[name]
    if tuple(tensor.shape) != info.shape:
        raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)} in the checkpoint; the model "
                         f"expects {info.shape}")
    flat = tensor.reshape(-1)
    for spec in records_for(rt, name):
        if records.kind(spec.record) in records.STATE_KINDS:
            rt.store.create(spec.record, spec.shape, spec.dtype, home=spec.home)
            continue
        if info.nf4:  # quantized here, once, one tensor at a time
            data = nf4.encode(tensor)
        else:
            data = (tensor if spec.span is None else flat[spec.span[0]:spec.span[1]]).to(spec.dtype).contiguous()
        fut = rt.store.put(spec.record, data, home=spec.home)
        writes.add(fut, data.numel() * data.element_size(), name)
        del data
