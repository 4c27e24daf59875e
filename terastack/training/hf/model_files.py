"""Hugging Face model files every language-model engine reads: the config, the model built on the meta device
(no memory), the safetensors checkpoint read tensor by tensor, and the checks a config must pass before training
(positions long enough, packed rows exact for its attention); and, for initializing a skeleton piece by piece,
its modules given real storage for a while under a seeded generator."""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn


#: Families whose attention transformers restricts to each packed example when ``position_ids`` restart inside a
#: row and no 2D attention mask is given (their model code hands the position ids to ``create_causal_mask``, which
#: derives a block-diagonal causal mask from them, for sdpa and eager attention alike), tested against running
#: each example on its own (tests/llm/test_accumulation.py). OPT, for one, builds its mask without the position
#: ids: packed rows there would attend across examples.
PACKING_FAMILIES = ("llama", "mistral", "qwen2", "gpt2")


#: attention implementations whose mask transformers builds from the position ids (flash attention takes them
#: differently and is not tested here)
PACKING_ATTENTION = ("sdpa", "eager")


def check_packing(hf_config, *, where: str = "pack") -> None:
    """Refuse packed rows (several examples in one row, positions restarting per example) for a model whose
    attention would cross the examples' boundaries; ``where`` names the field in the error."""
    family = getattr(hf_config, "model_type", "?")
    if family not in PACKING_FAMILIES:
        raise ValueError(f"{where}: packing several examples into one row is exact only where attention stays "
                         f"within each example; terastack verified that for {', '.join(PACKING_FAMILIES)} models, "
                         f"not for {family} (pad instead: no packing)")
    impl = getattr(hf_config, "_attn_implementation", None) or "sdpa"
    if impl not in PACKING_ATTENTION:
        raise ValueError(f"{where}: packed rows need {' or '.join(PACKING_ATTENTION)} attention (the block-diagonal "
                         f"mask comes from the position ids); this model uses {impl}")


@contextmanager
def _parameters_on_meta():
    """Every parameter registered inside is moved to the meta device (its memory is never touched)."""
    original = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_skeleton(hf_config, *, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The causal LM of ``hf_config`` with meta parameters and real buffers, tied as the config says."""
    from transformers import AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from transformers.modeling_utils import no_init_weights

    with no_init_weights(), _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    if getattr(hf_config, "tie_word_embeddings", False) or getattr(hf_config.get_text_config(), "tie_word_embeddings",
                                                                   False):
        inp, out = model.get_input_embeddings(), model.get_output_embeddings()
        if out is not None and inp is not None and out.weight is not inp.weight:
            out.weight = inp.weight
    for p in model.parameters():
        p.requires_grad_(True)
    model.train()
    return model


#: RoPE scalings a job may ask for (``--rope-scaling KIND FACTOR``): transformers' own rope types
ROPE_SCALINGS = ("linear", "dynamic", "yarn")


def _text_config(hf_config):
    return hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config


def computes_positions(hf_config) -> bool:
    """Whether the model computes its rotary angles on the fly (a ``rope_parameters`` config: Llama, Qwen,
    Mistral, ...), so positions past ``max_position_embeddings`` run; learned position tables (GPT-2, OPT) and
    precomputed rotary tables (GPT-J) have no row there."""
    return bool(getattr(_text_config(hf_config), "rope_parameters", None))


def check_seq_len(hf_config, seq_len: int) -> str | None:
    """Check a sequence length against the model's positions up front. A learned or precomputed table would fail
    deep inside the profile pass with a raw ``IndexError``: refused here. A model that computes rotary angles on
    the fly runs past its limit, on positions it never saw: the returned warning says so and how to extend the
    context (RoPE scaling, :func:`apply_rope_scaling`), as the common fine-tuners do. None: within the limit."""
    limit = getattr(_text_config(hf_config), "max_position_embeddings", None)
    if not (isinstance(limit, int) and limit > 0 and seq_len > limit):
        return None
    family = getattr(hf_config, "model_type", type(hf_config).__name__)
    if not computes_positions(hf_config):
        raise ValueError(f"seq_len {seq_len} > max_position_embeddings {limit} of {family}: the model has no "
                         "positions beyond that; lower seq_len")
    factor = -(-seq_len // limit)
    return (f"warning: seq_len {seq_len} > max_position_embeddings {limit} of {family}: positions past {limit} "
            f"were never trained; extend the context with --rope-scaling linear|dynamic|yarn {factor}")


def apply_rope_scaling(hf_config, kind: str, factor: float) -> None:
    """Scale the rotary positions of ``hf_config`` by ``factor`` (``kind`` one of :data:`ROPE_SCALINGS`) and
    raise ``max_position_embeddings`` with it, before the model is built: the exported config carries the
    scaling, so the model loads as it was trained."""
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling: must be one of {', '.join(ROPE_SCALINGS)}; got {kind!r}")
    if not factor > 1:
        raise ValueError(f"rope_scaling: the factor must be > 1; got {factor}")
    text = _text_config(hf_config)
    if not computes_positions(hf_config):
        raise ValueError(f"rope_scaling: {getattr(hf_config, 'model_type', '?')} has no rotary positions to scale")
    limit = text.max_position_embeddings
    params = {**text.rope_parameters, "rope_type": kind, "factor": float(factor)}
    if kind == "yarn":
        params["original_max_position_embeddings"] = limit
    text.rope_parameters = params
    text.max_position_embeddings = int(limit * factor)


class CheckpointReader:
    """Tensors of a local Hugging Face checkpoint directory (safetensors), read one at a time.

    Pickle-based ``*.bin`` checkpoints are refused: loading them could run code.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"model directory {self.path} does not exist")
        if not self.path.is_dir():
            raise ValueError(f"model path {self.path} is not a directory (expected a Hugging Face checkpoint dir)")
        index = self.path / "model.safetensors.index.json"
        single = self.path / "model.safetensors"
        self.files: dict[str, Path] = {}
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"checkpoint index {index} is unreadable ({exc})") from None
            from terastack.atomic import safe_relative

            for key, rel in weight_map.items():
                self.files[key] = safe_relative(self.path, rel)
        elif single.exists():
            self.files = {key: single for key in self._keys(single)}
        else:
            pickled = sorted(p.name for p in self.path.glob("*.bin"))
            hint = (f" ({', '.join(pickled)} found: pickle checkpoints are not read because loading them can run "
                    "code; convert them with `transformers` save_pretrained(safe_serialization=True))"
                    if pickled else "")
            raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {self.path}{hint}")
        self._handles: dict[Path, object] = {}

    @classmethod
    def of_file(cls, file: str | os.PathLike) -> "CheckpointReader":
        """A reader of one safetensors file (a peft adapter's ``adapter_model.safetensors``, say)."""
        file = Path(file)
        reader = cls.__new__(cls)
        reader.path = file.parent
        reader.files = {key: file for key in cls._keys(file)}
        reader._handles = {}
        return reader

    @classmethod
    def of_model(cls, path: str | os.PathLike, hf_config):
        """A reader of the model directory ``path``; a bitsandbytes 4-bit one's weights read dequantized (one at
        a time, terastack.training.hf.nf4), its ``hf_config`` then without ``quantization_config``: the model
        built, trained and exported from it is the unquantized one."""
        from terastack.training.hf import nf4

        reader = cls(path)
        if nf4.quantized_format(path) is None:
            return reader
        hf_config.__dict__.pop("quantization_config", None)
        return nf4.DequantizingReader(reader)

    @staticmethod
    def _keys(path: Path) -> list[str]:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return list(f.keys())
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"checkpoint file {path} is corrupt or not safetensors ({exc})") from None

    def keys(self) -> list[str]:
        return list(self.files)

    def _handle(self, path: Path):
        from safetensors import safe_open

        handle = self._handles.get(path)
        if handle is None:
            if not path.exists():
                raise FileNotFoundError(f"checkpoint shard {path} (named in the index) is missing")
            handle = self._handles[path] = safe_open(str(path), framework="pt")
        return handle

    def get(self, key: str) -> torch.Tensor:
        path = self.files[key]
        try:
            return self._handle(path).get_tensor(key)
        except (FileNotFoundError, KeyError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"checkpoint file {path}: tensor {key!r} cannot be read ({exc})") from None

    def info(self, key: str) -> tuple[tuple[int, ...], str]:
        """(shape, safetensors dtype name such as "BF16") of tensor ``key``, from the file's header alone."""
        path = self.files[key]
        try:
            view = self._handle(path).get_slice(key)
            return tuple(view.get_shape()), view.get_dtype()
        except (FileNotFoundError, KeyError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"checkpoint file {path}: tensor {key!r} cannot be read ({exc})") from None

    def close(self) -> None:
        self._handles.clear()


def load_hf_config(path: str | os.PathLike):
    from transformers import AutoConfig

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model directory {path} does not exist")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    try:
        return AutoConfig.from_pretrained(str(path))
    except (ValueError, OSError, KeyError) as exc:
        raise ValueError(f"{path / 'config.json'} is not a usable model config ({exc})") from None


# ---------------------------------------------------------------- a skeleton's weights, piece by piece
@contextmanager
def materialized(modules, fill: float | None = None):
    """Give the parameters of ``modules`` (not of their children) real CPU fp32 storage for the duration,
    uninitialized (or every element ``fill``); the original meta parameters (and so every tie between them) come
    back afterwards."""
    originals = {}
    try:
        for mod in modules:
            for pname, p in list(mod._parameters.items()):
                if p is not None:
                    originals[(mod, pname)] = p
                    data = (torch.empty(p.shape, dtype=torch.float32) if fill is None else
                            torch.full(p.shape, fill, dtype=torch.float32))
                    mod._parameters[pname] = nn.Parameter(data, requires_grad=p.requires_grad)
        yield
    finally:
        for (mod, pname), p in originals.items():
            mod._parameters[pname] = p


@contextmanager
def seeded(seed: int):
    """Draw from torch's CPU generator seeded with ``seed``; the caller's stream is untouched afterwards."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)
