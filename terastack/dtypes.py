"""Names of dtypes: the one table from the names terastack's flags, manifests and checkpoints use to torch dtypes.

Every file terastack writes names a dtype the way torch prints it without its prefix ("float32", "bfloat16");
every reader turns a name back through :func:`to_dtype`, which knows only this table (a name read from a file
never reaches ``getattr(torch, ...)``). The safetensors format has its own spelling ("F32", "BF16"), kept here
beside the names so the two cannot drift apart.
"""
from __future__ import annotations

import torch

#: name -> (torch dtype, safetensors name): every dtype a flag, manifest or checkpoint may name
_TABLE = {
    "float64": (torch.float64, "F64"),
    "float32": (torch.float32, "F32"),
    "float16": (torch.float16, "F16"),
    "bfloat16": (torch.bfloat16, "BF16"),
    "float8_e4m3fn": (torch.float8_e4m3fn, "F8_E4M3"),
    "float8_e5m2": (torch.float8_e5m2, "F8_E5M2"),
    "int64": (torch.int64, "I64"),
    "int32": (torch.int32, "I32"),
    "int16": (torch.int16, "I16"),
    "int8": (torch.int8, "I8"),
    "uint8": (torch.uint8, "U8"),
    "bool": (torch.bool, "BOOL"),
}
#: name -> torch dtype
DTYPES: dict[str, torch.dtype] = {name: dtype for name, (dtype, _) in _TABLE.items()}
#: torch dtype -> its safetensors name, and back
SAFETENSORS_NAMES: dict[torch.dtype, str] = {dtype: st for dtype, st in _TABLE.values()}
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {st: dtype for dtype, st in _TABLE.values()}
#: what a model computes in (the trainer's ``dtype``)
COMPUTE_DTYPES = ("float32", "bfloat16")
#: what model weights are exported or merged in
WEIGHT_DTYPES = ("float32", "bfloat16", "float16")


def dtype_name(dtype: torch.dtype) -> str:
    """The name files store for ``dtype`` ("float32")."""
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str, *, allowed: tuple[str, ...] | None = None, field: str = "dtype") -> torch.dtype:
    """The torch dtype ``name`` names; ``allowed`` narrows the names accepted. An unknown name is a ValueError
    naming ``field`` and the choices."""
    choices = allowed if allowed is not None else tuple(DTYPES)
    if name not in choices or name not in DTYPES:
        raise ValueError(f"{field}: must be one of {', '.join(choices)}; got {name!r}")
    return DTYPES[name]
