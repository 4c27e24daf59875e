"""Checkpoints written from the parameter servers' state: one shard file per server, one index for the job.

Layout of a checkpoint directory::

    checkpoint.json               index: the last complete step, its directory, the layout
    step-00000012/server-0.bin    raw fp32 extents (parameter chunk, exp_avg, exp_avg_sq per bucket)
    step-00000012/server-0.json   that shard's manifest: offsets, sizes, crc32 of every extent

[Note: a checkpoint is complete only once indexed]
Each server writes its shard (data, fdatasync, then its manifest atomically)
and tells server 0, which writes ``checkpoint.json`` atomically only after all
shards of the step are durable. A crash at any point leaves the previous index
naming a complete previous checkpoint; a half-written step directory is simply
never named. Nothing read back is unpickled: raw extents plus JSON, checked
against sizes and checksums.
"""
from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import torch

from terastack import io
from terastack.atomic import atomic_write_json, safe_relative
from terastack.constants import DIRECT_ALIGN, round_up
from terastack.dtypes import DTYPES, dtype_name
from terastack.disdp.buckets import Layout

INDEX = "checkpoint.json"
FORMAT = "terastack.disdp.shard_checkpoint"
VERSION = 1


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(t.contiguous().view(torch.uint8).numpy())


def write_shard(root: str | Path, step: int, server: int, tensors: dict[str, torch.Tensor], meta: dict) -> Path:
    """Write one server's tensors for ``step`` durably; returns the shard manifest's path."""
    directory = Path(root) / step_dir_name(step)
    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / f"server-{server}.bin"
    entries, offset = {}, 0
    with io.open(data_path, "w", direct=False) as f:
        pending = []
        for name, t in tensors.items():
            t = t.detach().contiguous()
            nbytes = t.numel() * t.element_size()
            entries[name] = {"offset": offset, "nbytes": nbytes, "shape": list(t.shape),
                             "dtype": dtype_name(t.dtype), "crc32": _crc(t)}
            if nbytes:
                pending.append((f.pwrite(t.view(torch.uint8).reshape(-1), offset, nbytes), t))
            offset += round_up(nbytes, DIRECT_ALIGN)
        for fut, _ in pending:
            fut.result(600)
        f.sync()
    manifest = {"format": FORMAT, "version": VERSION, "step": step, "server": server,
                "data_file": data_path.name, "data_bytes": offset, "tensors": entries, "meta": meta}
    return atomic_write_json(directory / f"server-{server}.json", manifest)


def commit_index(root: str | Path, step: int, layout: Layout, extra: dict, *, keep: int = 2) -> Path:
    """Name ``step`` as the latest complete checkpoint (atomically) and prune older step directories."""
    root = Path(root)
    path = atomic_write_json(root / INDEX, {
        "format": FORMAT, "version": VERSION, "step": step, "dir": step_dir_name(step),
        "servers": layout.servers, "fingerprint": layout.fingerprint(), "layout": layout.to_dict(), **extra})
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep else []:
        if old.name != step_dir_name(step):
            shutil.rmtree(old, ignore_errors=True)
    return path


def read_index(root: str | Path) -> dict | None:
    """The checkpoint index, or None when the directory holds no complete checkpoint."""
    path = Path(root) / INDEX
    if not path.exists():
        return None
    try:
        index = json.loads(path.read_text())
        if index.get("format") != FORMAT or index.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} v{VERSION} index")
        int(index["step"]), str(index["dir"]), int(index["servers"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint index {path} is unreadable: {exc}") from None
    return index


def read_shard(root: str | Path, index: dict, server: int) -> tuple[dict[str, torch.Tensor], dict]:
    """One server's tensors of the indexed step, each checked against its size and crc32."""
    directory = safe_relative(root, index["dir"])
    mpath = directory / f"server-{server}.json"
    try:
        manifest = json.loads(mpath.read_text())
        if manifest.get("format") != FORMAT or int(manifest["step"]) != int(index["step"]):
            raise ValueError(f"manifest is for step {manifest.get('step')}, index names step {index['step']}")
        entries = manifest["tensors"]
        data_path = safe_relative(directory, manifest["data_file"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint shard manifest {mpath} is unreadable: {exc}") from None
    size = data_path.stat().st_size if data_path.exists() else -1
    if size < int(manifest.get("data_bytes", 0)) - DIRECT_ALIGN:
        raise ValueError(f"checkpoint data file {data_path} is truncated ({size} bytes, manifest needs "
                         f"{manifest.get('data_bytes')})")
    out = {}
    with io.open(data_path, "r", direct=False) as f:
        for name, e in entries.items():
            dtype = DTYPES.get(str(e["dtype"]))
            if dtype is None:
                raise ValueError(f"checkpoint {mpath}: tensor {name!r} has unknown dtype {e['dtype']!r}")
            t = torch.empty([int(s) for s in e["shape"]], dtype=dtype)
            nbytes = t.numel() * t.element_size()
            if nbytes != int(e["nbytes"]):
                raise ValueError(f"checkpoint {mpath}: tensor {name!r} has {e['nbytes']} bytes, its shape needs "
                                 f"{nbytes}")
            if nbytes:
                f.read(t.view(torch.uint8).reshape(-1), int(e["offset"]), nbytes, timeout=600)
            if _crc(t) != int(e["crc32"]):
                raise ValueError(f"checkpoint {data_path}: tensor {name!r} fails its checksum (file damaged)")
            out[name] = t
    return out, manifest.get("meta", {})


def load_parameters(root: str | Path) -> tuple[dict[str, torch.Tensor], int]:
    """The full model's parameters (by name) and the step of the latest checkpoint in ``root``."""
    index = read_index(root)
    if index is None:
        raise ValueError(f"no checkpoint in {root} (no {INDEX})")
    buckets = Layout.bucket_dicts_from(index["layout"])
    layout = Layout(buckets, int(index["servers"]))
    shards = [read_shard(root, index, s)[0] for s in range(layout.servers)]
    flats = [torch.cat([shards[s][f"b{b.index}.param"] for s in range(layout.servers)]) for b in buckets]
    return {k: v.clone() for k, v in layout.unflatten(flats).items()}, int(index["step"])
