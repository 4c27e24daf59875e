"""bitsandbytes' NF4 (4-bit NormalFloat, QLoRA's format) for a frozen base: one tensor at a time, in bitsandbytes'
own functions, and the serialized layout transformers writes for a 4-bit model.

[Note: the NF4 record]
A frozen weight stored as NF4 is one flat uint8 record: the fp32 absmax of each block of :data:`BLOCKSIZE`
elements (viewed as bytes, first, so that the view back to fp32 starts 4-byte aligned), then the packed codes
(two a byte), as ``bitsandbytes.functional.quantize_4bit(..., quant_type="nf4", blocksize=64)`` returns them.
The quant map is NF4's fixed code and the shape is the parameter's, so nothing else is stored: about 0.5 bytes
a parameter plus 4 bytes per 64 (0.5625 in all). Decoding is ``dequantize_4bit`` over a ``QuantState`` rebuilt
from the absmax; it gives the same bits as dequantizing the quantizer's own state. A model directory quantized
with double quantization (``bnb_4bit_use_double_quant``: the absmax itself 8-bit) is read through its own
state and re-encoded: its dequantized blocks quantize back to the file's codes (each block's largest element
is exactly its absmax times NF4's +-1 code), with the absmax stored exactly as dequantized.

[Note: which weights are NF4]
As QLoRA and transformers' bitsandbytes quantizer do: the weights of the ``nn.Linear`` modules (the decoder
layers' projections), never the embeddings, norms or the output head (``lm_head``, the model's output
embeddings), and under LoRA only frozen ones (peft's adapter matrices are ``nn.Linear`` too, and train).
"""
from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from terastack.plan.base_formats import NF4_BLOCK, nf4_bytes
from terastack.plan.lowbit_library import bitsandbytes_functional

BLOCKSIZE = NF4_BLOCK
QUANT_TYPE = "nf4"
#: the companion tensors transformers saves beside a bitsandbytes 4-bit ``weight`` (its ``QuantState``)
STATE_SUFFIXES = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                  ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4")
#: in an adapter directory trained on an NF4 base: which base it was trained against (``terastack merge`` reads it)
BASE_FORMAT_FILE = "base_format.json"
#: bytes an NF4 record holds per parameter (packed codes + fp32 absmax per block)
BYTES_PER_PARAM = 0.5 + 4 / BLOCKSIZE


def _functional():
    try:
        return bitsandbytes_functional("lora.base_format nf4 (or a 4-bit model directory)")
    except ImportError as exc:
        raise ValueError(str(exc)) from None


#: elements quantized in one call: bitsandbytes' CPU quantizer makes fp32 and int32 copies of what it is given
#: (2 GB beside a 70B model's 0.9 GB projection), so a larger tensor goes in pieces of whole blocks, one per core
#: at a time. Its blocks are independent and a piece holds an even count, so the pieces' absmax and packed codes
#: side by side are the whole call's bytes.
ENCODE_PIECE = 1 << 22


def encode(tensor: torch.Tensor) -> torch.Tensor:
    """The NF4 record of ``tensor`` (quantized in fp32 by bitsandbytes' ``quantize_4bit``, in pieces of
    :data:`ENCODE_PIECE` elements, each made fp32 on its own: a bf16 weight is never copied whole to fp32)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel() <= ENCODE_PIECE:
        quantized = [_quantize(flat)]
    else:
        with ThreadPoolExecutor(torch.get_num_threads()) as pool:
            quantized = list(pool.map(_quantize, flat.split(ENCODE_PIECE)))
    return torch.cat([a for a, _ in quantized] + [p for _, p in quantized])


def _quantize(piece: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(absmax as bytes, packed codes) of one piece, quantized in fp32."""
    piece = piece.to(torch.float32).contiguous()
    packed, state = _functional().quantize_4bit(piece, blocksize=BLOCKSIZE, quant_type=QUANT_TYPE,
                                                compress_statistics=False)
    return state.absmax.to(torch.float32).contiguous().view(torch.uint8), packed.reshape(-1)


def decode(record: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The weight an NF4 record holds, dequantized by bitsandbytes' ``dequantize_4bit`` into ``dtype``."""
    bnbf = _functional()
    numel = math.prod(shape)
    head = 4 * math.ceil(numel / BLOCKSIZE)
    if record.numel() != nf4_bytes(numel):
        raise ValueError(f"an NF4 record of {record.numel()} bytes cannot hold a tensor of shape {tuple(shape)}")
    absmax = record[:head].view(torch.float32)
    state = bnbf.QuantState(absmax=absmax, shape=torch.Size(shape), code=_code(record.device), blocksize=BLOCKSIZE,
                            quant_type=QUANT_TYPE, dtype=dtype)
    return bnbf.dequantize_4bit(record[head:].view(-1, 1), quant_state=state)


_CODES: dict[torch.device, torch.Tensor] = {}


def _code(device: torch.device) -> torch.Tensor:
    if device not in _CODES:
        _CODES[device] = _functional().get_4bit_type(QUANT_TYPE, device=device)
    return _CODES[device]


def linear_weights(model: nn.Module) -> set[str]:
    """Parameter names of the weights NF4 may hold in ``model`` ([Note: which weights are NF4])."""
    get_out = getattr(model, "get_output_embeddings", None)
    try:
        head = get_out() if get_out is not None else None
    except (AttributeError, NotImplementedError):
        head = None
    # the head, or its parts where it streams in slices (terastack.llm.vocab_slices)
    skip = {id(m) for m in head.modules()} if isinstance(head, nn.Module) else set()
    return {f"{name}.weight" if name else "weight" for name, mod in model.named_modules()
            if isinstance(mod, nn.Linear) and id(mod) not in skip}


# ---------------------------------------------------------------- quantized model directories
def quantized_format(path: str | Path) -> str | None:
    """``"nf4"`` when the model directory ``path`` was saved quantized by bitsandbytes in 4-bit NF4 (its
    config.json's ``quantization_config``), None when not quantized; other quantizations are refused by name."""
    cfg_path = Path(path) / "config.json"
    try:
        qc = json.loads(cfg_path.read_text()).get("quantization_config")
    except (OSError, ValueError):
        return None
    if not qc:
        return None
    where = f"{cfg_path}: quantization_config"
    if qc.get("quant_method") != "bitsandbytes" or not qc.get("load_in_4bit"):
        raise ValueError(f"{where} is {qc.get('quant_method')!r} (load_in_4bit {qc.get('load_in_4bit')}); "
                         "terastack reads bitsandbytes 4-bit NF4 models, or unquantized ones")
    if qc.get("bnb_4bit_quant_type", "fp4") != QUANT_TYPE:
        raise ValueError(f"{where}: bnb_4bit_quant_type is {qc.get('bnb_4bit_quant_type')!r}; terastack reads "
                         "nf4 4-bit models")
    return QUANT_TYPE


class DequantizingReader:
    """A :class:`~terastack.training.hf.model_files.CheckpointReader` of a bitsandbytes-quantized directory that
    reads each 4-bit weight dequantized to fp32 (its quant state's companion keys hidden): bounded memory, one
    tensor at a time, through bitsandbytes' own ``QuantState.from_dict`` and ``dequantize_4bit``."""

    def __init__(self, reader):
        self.reader = reader
        self.path = reader.path
        keys = reader.keys()
        self.quantized = {k for k in keys if f"{k}.absmax" in reader.files}
        self.files = {k: f for k, f in reader.files.items() if not _is_state_key(k, self.quantized)}

    def keys(self) -> list[str]:
        return list(self.files)

    def get(self, key: str) -> torch.Tensor:
        if key not in self.quantized:
            return self.reader.get(key)
        state = self._state(key)
        return _functional().dequantize_4bit(self.reader.get(key), quant_state=state)

    def info(self, key: str) -> tuple[tuple[int, ...], str]:
        if key not in self.quantized:
            return self.reader.info(key)
        return tuple(self._state(key).shape), "F32"

    def _state(self, key: str):
        bnbf = _functional()
        parts = {k[len(key) + 1:]: self.reader.get(k) for k in self.reader.files
                 if k.startswith(f"{key}.") and k[len(key):].startswith(STATE_SUFFIXES)}
        try:
            state = bnbf.QuantState.from_dict(parts, device=torch.device("cpu"))
        except (ValueError, KeyError, AssertionError) as exc:  # bitsandbytes checks its keys by assert
            raise ValueError(f"checkpoint {self.path}: the bitsandbytes quant state of {key!r} is unreadable "
                             f"({exc})") from None
        if state.quant_type != QUANT_TYPE:
            raise ValueError(f"checkpoint {self.path}: {key!r} is {state.quant_type}; terastack reads nf4")
        state.dtype = torch.float32  # dequantized exactly, whatever dtype the model was quantized from
        return state

    def close(self) -> None:
        self.reader.close()


def _is_state_key(key: str, quantized: set[str]) -> bool:
    for suffix in STATE_SUFFIXES:
        if key.endswith(suffix) and key[: -len(suffix)] in quantized:
            return True
    return False
