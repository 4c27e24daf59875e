"""Checkpoints (resume training exactly) and ``save_pretrained`` export (load with ``transformers``).

[Note: checkpoint layout and atomicity]
A checkpoint directory holds one complete snapshot per ``step-NNNNNNNN``
subdirectory and a ``LATEST`` pointer::

    ckpt/LATEST                       {"checkpoint": "step-00000010"}
    ckpt/step-00000010/state.bin      raw tensors, each 4 KiB-aligned
    ckpt/step-00000010/checkpoint.json  manifest: model config and fingerprint,
                                      trainer state, per tensor: dtype, shape,
                                      offset, bytes, CRC-32

A snapshot is written into a temporary directory, fsynced, renamed into place,
and only then is ``LATEST`` replaced (write to a temp name, fdatasync, rename,
fsync the directory). A crash at any point leaves ``LATEST`` naming the
previous complete snapshot; older snapshots are removed after the pointer
moves. Tensors are streamed from the store one optimizer chunk at a time,
so saving never needs more memory than training does. Per parameter it stores
the fp32 master and both AdamW moments (or the weight of a frozen tensor); the
chunking of the run that wrote it does not matter to the run that reads it.

Nothing is unpickled: the manifest is JSON and tensors are raw bytes whose
sizes and checksums are checked before use.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from terastack.atomic import atomic_write_json, fsync_dir, replace_dir, safe_relative
from terastack.constants import DIRECT_ALIGN, round_up
from terastack.llm.machine import resolve_device, resolve_dtype
from terastack.training.hf.keys import export_layout
from terastack.llm.engine.store_layout import records_for
from terastack.training.hf.sharded_writer import (DEFAULT_MAX_SHARD_SIZE, copy_tokenizer_files, shard_limit, staged_dir,
                                          write_safetensors_files)

FORMAT = "terastack.llm.checkpoint"
VERSION = 1
LATEST = "LATEST"
MANIFEST = "checkpoint.json"
DATA = "state.bin"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_fingerprint(tensors: dict) -> str:
    """Names and shapes of every parameter: two checkpoints of one architecture share it."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(f"{name}:{list(tensors[name].shape)};".encode())
    return h.hexdigest()[:32]


def _tensor_bytes(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy()


def _parts(trainer, name: str) -> dict[str, list[str]]:
    """The store records holding each part (master/exp_avg/exp_avg_sq/weight) of parameter ``name``, in order."""
    rt = trainer.runtime
    if trainer.tensors[name].trainable:
        return {"master": rt.master_records(name), "exp_avg": rt.moment_records(name, 1),
                "exp_avg_sq": rt.moment_records(name, 2)}
    return {"weight": [rt.compute_record(name)]}


# ------------------------------------------------------------------- save
def save_checkpoint(trainer, path: str | os.PathLike, *, extra: dict | None = None) -> Path:
    """Write a snapshot of ``trainer`` into checkpoint directory ``path``; returns the snapshot's directory."""
    root = Path(path)
    trainer.synchronize()
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{trainer.step_count:08d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        entries = {}
        offset = 0
        with open(tmp / DATA, "wb") as f:
            for pname in sorted(trainer.tensors, key=lambda n: trainer.tensors[n].index):
                info = trainer.tensors[pname]
                for part, records in _parts(trainer, pname).items():
                    offset = round_up(offset, DIRECT_ALIGN)
                    f.seek(offset)
                    crc = 0
                    nbytes = 0
                    dtype = None
                    for record in records:
                        t = trainer.runtime.read_record(record)
                        dtype = t.dtype
                        data = _tensor_bytes(t)
                        f.write(data)
                        crc = zlib.crc32(data, crc)
                        nbytes += data.nbytes
                    entries[f"{part}:{pname}"] = {"shape": list(info.shape), "dtype": str(dtype).removeprefix("torch."),
                                                 "offset": offset, "nbytes": nbytes, "crc32": crc}
                    offset += nbytes
            f.flush()
            os.fdatasync(f.fileno())
        manifest = {
            "format": FORMAT, "version": VERSION, "data_file": DATA, "data_bytes": offset,
            "model": {"name": trainer.name, "model_type": trainer.family, "config": trainer.hf_config.to_dict(),
                      "fingerprint": model_fingerprint(trainer.tensors),
                      "lora": _lora_dict(trainer)},
            # the components' own state: the trainer's progress (step, RNG), the optimizer's (lr, step counts)
            "trainer": {**trainer.progress_state(), **trainer.optimizer.state_dict(),
                        "config": trainer.config.to_dict()},
            "extra": extra or {},
            "tensors": entries,
        }
        atomic_write_json(tmp / MANIFEST, manifest)
        fsync_dir(tmp)
        replace_dir(tmp, root / name)
        atomic_write_json(root / LATEST, {"checkpoint": name, "step": trainer.step_count})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Older snapshots, and debris of writers killed mid-save (one writer per checkpoint directory).
    for old in [*root.glob("step-*"), *root.glob(".tmp-step-*"), *root.glob(".old-step-*")]:
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return root / name


def _lora_dict(trainer) -> dict | None:
    if trainer.lora is None:
        return None
    return {"spec": trainer.lora.spec_dict(), "base": trainer.lora.base_path}


# ------------------------------------------------------------------- load
def read_manifest(path: str | os.PathLike) -> tuple[Path, dict]:
    """(snapshot directory, manifest) of checkpoint ``path`` (its LATEST snapshot, or a snapshot dir itself)."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"checkpoint {root} does not exist")
    if (root / MANIFEST).exists():
        snap = root
    else:
        latest = root / LATEST
        if not latest.exists():
            raise FileNotFoundError(f"{root} is not a terastack checkpoint (no {LATEST} or {MANIFEST})")
        try:
            rel = json.loads(latest.read_text())["checkpoint"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"checkpoint pointer {latest} is unreadable ({exc})") from None
        snap = safe_relative(root, rel)
    try:
        manifest = json.loads((snap / MANIFEST).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {snap} has no {MANIFEST}") from None
    except ValueError as exc:
        raise ValueError(f"checkpoint manifest {snap / MANIFEST} is not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{snap / MANIFEST} is not a terastack LLM checkpoint")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{snap / MANIFEST}: checkpoint version {manifest.get('version')} (this terastack reads "
                         f"{VERSION})")
    data = safe_relative(snap, manifest.get("data_file", DATA))
    if not data.exists():
        raise FileNotFoundError(f"checkpoint data file {data} is missing")
    if data.stat().st_size < int(manifest.get("data_bytes", 0)):
        raise ValueError(f"checkpoint data file {data} is truncated: {data.stat().st_size} bytes, manifest "
                         f"says {manifest['data_bytes']}")
    return snap, manifest


@dataclass(slots=True)
class Resume:
    """What rebuilding the trainer of a checkpoint needs: the skeleton (with LoRA adapters if it had them), its
    config, its name, the snapshot (``state``, for :func:`fill_from_checkpoint`) and the fingerprint to check."""

    model: object
    hf_config: object
    lora: object
    name: str
    state: dict
    fingerprint: str


def open_for_resume(path, config, *, expect_model=None) -> Resume:
    """Read checkpoint ``path`` and build the skeleton of the model that wrote it (``config``: the resuming
    ``TrainerConfig``; ``expect_model``: a config the checkpoint must match)."""
    from transformers import AutoConfig

    from terastack.training.hf.model_files import build_skeleton

    snap, manifest = read_manifest(path)
    model = manifest["model"]
    try:
        hf_config = AutoConfig.for_model(model["model_type"], **{k: v for k, v in model["config"].items()
                                                                 if k != "model_type"})
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{snap / MANIFEST}: model config is unusable ({exc})") from None
    if expect_model is not None:
        _check_same_model(expect_model, hf_config, snap)
    skeleton = build_skeleton(hf_config, dtype=resolve_dtype(config.dtype, resolve_device(config.device)))
    lora = None
    if model.get("lora"):
        from terastack.llm.lora import LoraSpec, apply_lora

        spec = LoraSpec(**model["lora"]["spec"])
        skeleton, lora = apply_lora(skeleton, spec, base_path=model["lora"].get("base"))
    return Resume(model=skeleton, hf_config=hf_config, lora=lora, name=model.get("name", str(path)),
                  state={"snapshot": snap, "manifest": manifest}, fingerprint=model["fingerprint"])


def check_fingerprint(tensors: dict, resume: Resume) -> None:
    """The rebuilt model's tensors must be the checkpoint's (they already matched one by one while filling the
    store; a mismatch here is a bug)."""
    if model_fingerprint(tensors) != resume.fingerprint:
        raise ValueError(f"checkpoint {resume.state['snapshot']}: model fingerprint differs from the rebuilt model")


def _check_same_model(expected, hf_config, snap: Path) -> None:
    """A resume must continue the same model: compare the architecture fields that shape its tensors."""
    keys = ("model_type", "vocab_size", "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "intermediate_size",
            "ffn_dim", "num_attention_heads", "n_head", "num_key_value_heads", "tie_word_embeddings")
    exp = expected.to_dict() if hasattr(expected, "to_dict") else dict(expected)
    got = hf_config.to_dict()
    diffs = [f"{k}: checkpoint {got.get(k)!r}, model {exp.get(k)!r}" for k in keys
             if k in exp or k in got if exp.get(k) != got.get(k)]
    if diffs:
        raise ValueError(f"checkpoint {snap} belongs to another model ({'; '.join(diffs)})")


def fill_from_checkpoint(trainer, state: dict) -> None:
    """Put every tensor of the snapshot into the trainer's store (checking sizes and CRC-32), restore state."""
    from terastack.io import File

    snap, manifest = state["snapshot"], state["manifest"]
    entries = manifest["tensors"]
    data_path = safe_relative(snap, manifest["data_file"])
    with File(data_path, "r", direct=False) as f:
        for pname in sorted(trainer.tensors, key=lambda n: trainer.tensors[n].index):
            info = trainer.tensors[pname]
            for part, records in _parts(trainer, pname).items():
                key = f"{part}:{pname}"
                entry = entries.get(key)
                if entry is None:
                    raise ValueError(f"checkpoint {snap} has no {part} for parameter {pname!r}: it was written for "
                                     "another model (or with other trainable parameters)")
                dtype = _DTYPES.get(entry["dtype"])
                if dtype is None or list(entry["shape"]) != list(info.shape):
                    raise ValueError(f"checkpoint {snap}: {key} has shape {entry['shape']} ({entry['dtype']}); the "
                                     f"model expects {list(info.shape)}")
                n = info.numel
                size = torch.empty((), dtype=dtype).element_size()
                if int(entry["nbytes"]) != n * size:
                    raise ValueError(f"checkpoint {snap}: {key} holds {entry['nbytes']} bytes, expected {n * size}")
                flat = torch.empty(n, dtype=dtype)
                if n:
                    f.read(flat.view(torch.uint8), int(entry["offset"]), n * size)
                crc = zlib.crc32(_tensor_bytes(flat))
                if crc != int(entry["crc32"]):
                    raise ValueError(f"checkpoint data file {data_path}: {key} fails its checksum (CRC-32 "
                                     f"{crc:#010x}, manifest {int(entry['crc32']):#010x}); the file is corrupt")
                _put_part(trainer, pname, part, records, flat)
    trainer.load_progress_state(manifest["trainer"])
    trainer.optimizer.load_state_dict(manifest["trainer"])
    trainer.resumed_extra = manifest.get("extra", {})
    trainer.store.wait(timeout=trainer.config.timeout)


def _put_part(trainer, name: str, part: str, records: list[str], flat: torch.Tensor) -> None:
    rt = trainer.runtime
    info = trainer.tensors[name]
    homes = {r: (h, shape, span) for r, _, h, shape, span in records_for(rt, name)}
    if part == "master" and not rt.master_is_compute:
        low_record = rt.compute_record(name)
        home = homes[low_record][0]
        rt.wait(trainer.store.put(low_record, flat.view(info.shape).to(trainer.compute_dtype), home=home),
                f"{low_record!r} reaching the store")
    for record in records:
        home, shape, span = homes[record]
        data = flat.view(info.shape) if span is None else flat[span[0]:span[1]]
        if part == "weight":
            data = data.to(trainer.compute_dtype if trainer.compute_dtype != torch.float32 else data.dtype)
        rt.wait(trainer.store.put(record, data.contiguous(), home=home), f"{record!r} reaching the store")


# ----------------------------------------------------------------- export
_EXPORT_DTYPES = {None: torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
                  "float16": torch.float16}


def export_pretrained(trainer, path: str | os.PathLike, *, dtype: str | None = None,
                      max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (shards and their index above ``max_shard_size``: [Note:
    sharded export]), or a peft adapter for LoRA, and the tokenizer files into ``path``, atomically.

    Tensors are streamed one group at a time into the safetensors files: the model is never whole in memory.
    """
    target = _EXPORT_DTYPES.get(dtype)
    if target is None:
        raise ValueError(f"dtype: must be float32, bfloat16 or float16; got {dtype!r}")
    limit = shard_limit(max_shard_size)
    trainer.synchronize()
    with staged_dir(path) as tmp:
        if trainer.lora is not None:
            # one adapter_model.safetensors, as peft writes it (adapters are small; peft does not shard them)
            groups = [({key: (trainer.tensors[pname].shape, target)},
                       lambda p=pname, k=key: {k: trainer.parameter(p)})
                      for pname, key in trainer.lora.adapter_names(trainer.tensors).items()]
            write_safetensors_files(tmp, groups, filename="adapter_model.safetensors")
            trainer.lora.write_config(tmp)
        else:
            # the keys and tensors transformers' save_pretrained writes ([Note: checkpoint keys])
            groups = [({key: (shape, target) for key, shape in shapes.items()},
                       lambda run=run: run(trainer.parameter))
                      for _, run, shapes in export_layout(trainer.model, trainer.tensors)]
            write_safetensors_files(tmp, groups, max_shard_size=limit,
                                    total_parameters=sum(info.numel for info in trainer.tensors.values()))
            # the dtype the weights are written in (transformers loads in it); the trainer's config is untouched
            cfg = copy.deepcopy(trainer.hf_config)
            cfg.dtype = str(target).removeprefix("torch.")
            cfg.to_json_file(str(tmp / "config.json"))
        copy_tokenizer_files(getattr(trainer, "source_dir", None), tmp)
    return Path(path)
