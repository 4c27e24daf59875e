"""Models and data for distributed training: built-in tiny models, Hugging Face directories, token batches.

The model code stays single-device and unmodified; sharding is applied from
outside (:mod:`terastack.disdp.worker`). Every role builds the same model from
the same :class:`ModelSpec` and seed, so initial weights agree bit for bit.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

BUILTIN = ("toy", "tiny-llama")


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    #: "toy" (plain PyTorch), "tiny-llama" (transformers, random init) or a Hugging Face model directory
    name: str = "tiny-llama"
    dim: int = 64
    layers: int = 2
    vocab: int = 256
    heads: int = 4
    seq_len: int = 32

    def __post_init__(self) -> None:
        if self.name not in BUILTIN and not os.path.isfile(os.path.join(self.name, "config.json")):
            raise ValueError(f"model: {self.name!r} is neither a built-in model ({', '.join(BUILTIN)}) nor a "
                             "directory with a Hugging Face config.json")
        for f in ("dim", "layers", "vocab", "heads", "seq_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: must be >= 1, got {getattr(self, f)}")
        if self.name == "tiny-llama" and self.dim % self.heads:
            raise ValueError(f"dim: {self.dim} is not divisible by heads={self.heads}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def vocab_size(self) -> int:
        if self.name in BUILTIN:
            return self.vocab
        with open(os.path.join(self.name, "config.json")) as f:
            return int(json.load(f)["vocab_size"])


class ToyBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class ToyLM(nn.Module):
    """A small residual MLP language model in plain PyTorch (fast to import and run in tests)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embed = nn.Embedding(spec.vocab, spec.dim)
        self.blocks = nn.ModuleList(ToyBlock(spec.dim) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(spec.dim)
        self.head = nn.Linear(spec.dim, spec.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


_INITIALIZERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                 "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def params_on_meta():
    """Parameters created inside go to the meta device; buffers (rotary tables...) stay real.

    Workers build their model this way: no full copy of the weights ever
    exists on a worker, while buffers computed at construction stay usable.
    """
    original = nn.Module.register_parameter

    def register(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    # Random init of a meta tensor computes nothing, but its first call imports the compiler stack
    # (seconds per process): initializers leave meta tensors alone.
    inits = {name: getattr(nn.init, name) for name in _INITIALIZERS if hasattr(nn.init, name)}

    def skip_meta(fn):
        def init(tensor, *args, **kwargs):
            return tensor if getattr(tensor, "is_meta", False) else fn(tensor, *args, **kwargs)
        return init
    nn.Module.register_parameter = register
    for name, fn in inits.items():
        setattr(nn.init, name, skip_meta(fn))
    try:
        yield
    finally:
        nn.Module.register_parameter = original
        for name, fn in inits.items():
            setattr(nn.init, name, fn)


def build_model(spec: ModelSpec, *, seed: int, meta: bool = False) -> nn.Module:
    """The model with its initial weights (seeded), or with parameters on the meta device."""
    torch.manual_seed(seed)
    ctx = params_on_meta() if meta else contextlib.nullcontext()
    with ctx:
        if spec.name == "toy":
            model = ToyLM(spec)
        elif spec.name == "tiny-llama":
            from transformers import LlamaConfig, LlamaForCausalLM

            config = LlamaConfig(hidden_size=spec.dim, intermediate_size=2 * spec.dim,
                                 num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                                 num_key_value_heads=spec.heads, vocab_size=spec.vocab,
                                 max_position_embeddings=max(64, spec.seq_len), tie_word_embeddings=False)
            config._attn_implementation = "eager"
            model = LlamaForCausalLM(config)
        else:
            from transformers import AutoConfig, AutoModelForCausalLM

            if meta:
                config = AutoConfig.from_pretrained(spec.name)
                config._attn_implementation = "eager"
                model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
            else:
                model = AutoModelForCausalLM.from_pretrained(spec.name, torch_dtype=torch.float32,
                                                             attn_implementation="eager")
    return model.float() if not meta else model


def loss_of(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch (every token counts equally)."""
    if isinstance(model, ToyLM):
        logits = model(input_ids[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1))
    return model(input_ids=input_ids, labels=input_ids).loss


def global_batch(spec: ModelSpec, *, step: int, seed: int, rows: int) -> torch.Tensor:
    """The token batch of ``step``: a deterministic function of (seed, step), the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, spec.vocab_size, (rows, spec.seq_len), generator=gen)


def worker_batch(spec: ModelSpec, *, step: int, seed: int, micro_batch: int, worker: int,
                 workers: int) -> torch.Tensor:
    """Worker ``worker``'s rows of the global batch (equal shares, so mean of means = global mean)."""
    batch = global_batch(spec, step=step, seed=seed, rows=micro_batch * workers)
    return batch[worker * micro_batch:(worker + 1) * micro_batch]
