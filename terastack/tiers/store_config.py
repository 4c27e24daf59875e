"""The store's configuration: its directories, budgets, device and I/O settings (``TieredStore.Config``)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from terastack.io.cuda import MIN_CHUNK
from terastack.tiers.placement import StripeBySize
from terastack.units import parse_bytes


def resolve_store_device(device: str) -> torch.device:
    """``Config.device`` as a torch device with its index: a bare "cuda" is the current device *now*, because
    the store's I/O threads would resolve it to device 0."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def split_dirs(root) -> tuple[str, ...]:
    """The store's directories from ``root``: one path, a comma-separated string of paths, or a sequence of
    paths. Raises ValueError naming ``root`` for an empty or repeated directory."""
    if isinstance(root, (str, os.PathLike)):
        parts = os.fspath(root).split(",")
    elif isinstance(root, Sequence):
        parts = [os.fspath(p) for p in root]
    else:
        raise ValueError(f"root: a directory, comma-separated directories or a list of them; got {root!r}")
    dirs = tuple(p.strip() for p in parts)
    if not dirs or not all(dirs):
        raise ValueError(f"root: a directory for the store's SSD files is required (got {root!r})")
    seen: dict[str, str] = {}
    for d in dirs:
        key = os.path.abspath(d)
        if key in seen:
            raise ValueError(f"root: directory {d!r} is listed twice (as {seen[key]!r})")
        seen[key] = d
    return dirs



@dataclass(kw_only=True, slots=True)
class StoreConfig:
    """What :class:`terastack.tiers.TieredStore` is built from (``TieredStore.Config``)."""

    #: one directory, several separated by commas ("/nvme0/run,/nvme1/run"), or a sequence of them: one per
    #: SSD. Normalised to the first directory (it holds the manifest); all of them are in `dirs`.
    root: str | Sequence[str]
    device_budget: int | str = 0
    host_budget: int | str = 0
    #: pinned staging for accelerator transfers: reusable chunks, their bytes counted in the host tier's
    #: ledger; records larger than this are staged chunk by chunk ([Note: pinned staging] in
    #: terastack.io.cuda). Size it from the plan with :func:`terastack.plan.staging.staging_cap`.
    pinned_budget: int | str = "256MiB"
    #: "auto": cuda when available, else the device tier is host memory with its own budget
    device: str = "auto"
    direct: bool | str = "auto"
    copy_on_write: bool = True
    #: per directory, its measured bandwidth (any unit, only ratios matter): the default placement gives
    #: each directory that share of the bytes. Empty: equal shares.
    bandwidths: Sequence[float] = ()
    #: every directory of the store, in order; filled from `root`. Given as well, it must agree with `root`
    #: (all of them, or the first): `dataclasses.replace` of a normalised Config keeps every directory.
    dirs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        dirs = split_dirs(self.root)
        if self.dirs:
            given = split_dirs(self.dirs)
            if dirs not in (given, given[:1]):
                raise ValueError(f"dirs: {given} disagrees with root {self.root!r}")
            dirs = given
        self.dirs, self.root = dirs, dirs[0]
        for name in ("device_budget", "host_budget", "pinned_budget"):
            setattr(self, name, parse_bytes(getattr(self, name), field=name))
        if self.pinned_budget < MIN_CHUNK:
            raise ValueError(f"pinned_budget: at least {MIN_CHUNK} bytes (one staging chunk); "
                             f"got {self.pinned_budget}")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device: must be auto, cpu or cuda[:N]; got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device: {self.device!r} requested but CUDA is not available")
        if isinstance(self.bandwidths, str):
            self.bandwidths = [b for b in self.bandwidths.split(",") if b.strip()]
        try:
            self.bandwidths = StripeBySize(weights=tuple(self.bandwidths)).weights
        except (ValueError, TypeError) as exc:
            raise ValueError(f"bandwidths: every directory's bandwidth must be a positive number; "
                             f"got {self.bandwidths!r}") from exc
        if self.bandwidths and len(self.bandwidths) != len(self.dirs):
            raise ValueError(f"bandwidths: {len(self.bandwidths)} given for {len(self.dirs)} directories")
