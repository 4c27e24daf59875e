"""Writing a directory ``transformers`` loads: safetensors files streamed group by group, sharded as
``save_pretrained`` shards them, with the index, committed atomically.

[Note: sharded export]
``save_pretrained(max_shard_size=...)`` writes one ``model.safetensors`` when the tensors fit in one shard,
else ``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json``
(``{"metadata": {"total_size": bytes, ...}, "weight_map": {key: file}}``). Shards are filled in file order
and a new one starts when the next tensor would tip the current one over the limit; a tensor larger than
the limit gets a shard of its own (as huggingface_hub's ``split_torch_state_dict_into_shards`` does; here the
shards stay in file order, so the files are written one after the other). Every shape and dtype is known
before any tensor is read, so each shard's header is written first and then its tensors, one group at a time:
only the tensors of one group (one parameter, or the few a transformers conversion makes from one) are ever
in memory. The files go into a temporary directory that replaces the output only once complete.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

from terastack.dtypes import SAFETENSORS_NAMES
from terastack.units import parse_bytes

from terastack.atomic import fsync_dir, replace_dir
from terastack.training.output_dir import check_replaceable

SAFE_WEIGHTS = "model.safetensors"
SAFE_WEIGHTS_INDEX = "model.safetensors.index.json"
#: the default of ``Trainer.save_pretrained`` and ``terastack merge`` (transformers' own default is 50GB; 5GB
#: shards are what the Hugging Face Hub serves well)
DEFAULT_MAX_SHARD_SIZE = "5GB"


def shard_limit(max_shard_size: int | str) -> int:
    """``max_shard_size`` (bytes, or a size such as "5GB") as bytes, at least 1."""
    limit = parse_bytes(max_shard_size, field="max_shard_size")
    if limit < 1:
        raise ValueError(f"max_shard_size: must be at least 1 byte, got {max_shard_size!r}")
    return limit


#: files that travel with the weights so the directory loads on its own (tokenizer, chat template, generation)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")

#: ({key: (shape, dtype)}, make): ``make()`` returns {key: tensor} for exactly those keys (converted to ``dtype``
#: on write)
Group = tuple[dict[str, tuple[tuple[int, ...], torch.dtype]], Callable[[], dict[str, torch.Tensor]]]


def nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def plan_shards(sizes: list[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Keys per shard, in order, for (key, bytes) in file order. See [Note: sharded export]."""
    shards: list[list[str]] = []
    current: list[str] = []
    used = 0
    for key, size in sizes:
        if size > max_shard_size:
            if current:
                shards.append(current)
            shards.append([key])
            current, used = [], 0
            continue
        if current and used + size > max_shard_size:
            shards.append(current)
            current, used = [], 0
        current.append(key)
        used += size
    if current or not shards:
        shards.append(current)
    return shards


def shard_names(count: int, single: str = SAFE_WEIGHTS) -> list[str]:
    """transformers' file names for ``count`` shards (``single``, ``model.safetensors``, for one)."""
    if count == 1:
        return [single]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _header(keys: list[str], specs: dict) -> bytes:
    header = {}
    offset = 0
    for key in keys:
        shape, dtype = specs[key]
        n = nbytes(shape, dtype)
        header[key] = {"dtype": SAFETENSORS_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _tensor_bytes(t: torch.Tensor):
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()


def _finish(f) -> None:
    f.flush()
    os.fdatasync(f.fileno())
    f.close()


class _ShardFiles:
    """The shard files, written in order: the first key of the next shard closes one file and opens the next."""

    def __init__(self, directory: Path, shards: list[list[str]], names: list[str], specs: dict):
        self.directory, self.shards, self.names, self.specs = directory, shards, names, specs
        self.shard_of = {key: i for i, keys in enumerate(shards) for key in keys}
        self.current = -1
        self.file = None

    def _open(self, shard: int) -> None:
        if self.file is not None:
            _finish(self.file)
        self.current = shard
        self.file = open(self.directory / self.names[shard], "wb")
        self.file.write(_header(self.shards[shard], self.specs))

    def write_group(self, keys, tensors: dict[str, torch.Tensor]) -> None:
        """Write ``tensors`` in the order of ``keys`` (the order the headers give them)."""
        if set(tensors) != set(keys):
            raise RuntimeError(f"export: a group made {sorted(tensors)[:4]}, its layout lists {list(keys)[:4]}")
        for key in keys:
            shard = self.shard_of[key]
            if shard != self.current:
                self._open(shard)
            t = tensors[key]
            shape, dtype = self.specs[key]
            if tuple(t.shape) != shape:
                raise RuntimeError(f"export: tensor {key!r} came out with shape {tuple(t.shape)}, expected {shape}")
            self.file.write(_tensor_bytes(t.to(dtype)))

    def __enter__(self) -> "_ShardFiles":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            if self.file is None:    # no tensors at all: still one valid (empty) file
                self._open(0)
            _finish(self.file)
        elif self.file is not None:
            self.file.close()


def write_safetensors_files(directory: Path, groups: list[Group], *, max_shard_size: int | None = None,
                            total_parameters: int | None = None, filename: str = SAFE_WEIGHTS) -> dict[str, str]:
    """Write ``groups`` into ``directory`` as ``filename`` (everything in one shard, or no limit) or as shards plus
    ``model.safetensors.index.json``; returns the weight map {key: file}. Only one group's tensors are in memory
    at a time. ``total_parameters`` goes into the index's metadata, as transformers writes it."""
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for shapes, _ in groups:
        for key, (shape, dtype) in shapes.items():
            if key in specs:
                raise ValueError(f"export: tensor {key!r} would be written twice")
            if dtype not in SAFETENSORS_NAMES:
                raise ValueError(f"export: tensor {key!r} has dtype {dtype}, which safetensors cannot hold")
            specs[key] = (tuple(shape), dtype)
    sizes = [(key, nbytes(*spec)) for key, spec in specs.items()]
    shards = plan_shards(sizes, max_shard_size if max_shard_size is not None else math.inf)
    names = shard_names(len(shards), filename)
    weight_map = {key: name for keys, name in zip(shards, names) for key in keys}
    with _ShardFiles(directory, shards, names, specs) as files:
        for shapes, make in groups:
            files.write_group(shapes, make())   # the group's tensors die on return, before the next group is made
    if len(names) > 1:
        metadata = {"total_size": sum(size for _, size in sizes)}
        if total_parameters is not None:
            metadata["total_parameters"] = int(total_parameters)
        index = {"metadata": metadata, "weight_map": weight_map}
        with open(directory / SAFE_WEIGHTS_INDEX, "w", encoding="utf-8") as index_file:
            index_file.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
            index_file.flush()
            os.fdatasync(index_file.fileno())
    return weight_map


@contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory beside ``out`` that replaces ``out`` when the block ends without an exception (and is
    removed when it raises): readers of ``out`` see the old directory or the complete new one, never a mix.
    ``out`` must be absent, empty or an earlier export (:func:`~terastack.training.output_dir.check_replaceable`)."""
    out = Path(out)
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        fsync_dir(tmp)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def copy_tokenizer_files(source: str | os.PathLike | None, dest: Path) -> None:
    """Copy the tokenizer, chat template and generation config of model directory ``source`` into ``dest``."""
    if not source:
        return
    for fname in TOKENIZER_FILES:
        p = Path(source) / fname
        if p.is_file():
            shutil.copy2(p, dest / fname)
