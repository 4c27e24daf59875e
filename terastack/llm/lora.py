"""LoRA through ``peft`` on a base model streamed read-only from the store.

``peft.get_peft_model`` wraps the meta skeleton exactly as it wraps an
in-memory model; the base weights are frozen, so they get one read-only
record each (no master, no moments, never written back), and only the
adapter tensors have fp32 masters and AdamW state. Units and streaming are
unchanged: a decoder layer's unit now also carries its adapters.

Canonical names are peft's (``base_model.model.<base name with .base_layer>``
and ``...lora_A.<adapter>.weight``); this module maps them to the base
checkpoint's keys and to the keys of a peft adapter file (adapter name
removed), which is what ``save_pretrained`` writes and ``init_from`` reads.

The frozen base may rest and stream as NF4 (``lora.base_format``): its linear weights quantized once as the
store is filled, each unit dequantizing its own where it computes (terastack.training.hf.nf4's [Note: the NF4
record] and [Note: which weights are NF4]). The adapter then trains against the dequantized base, as QLoRA's
does, and its directory says so (``nf4.BASE_FORMAT_FILE``), so that ``terastack merge`` merges it into that
same base.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from terastack.llm.trainer_config import LoraSpec
from terastack.training.hf import nf4


class LoraHandle:
    """What the trainer needs to know about the adapters of a peft-wrapped skeleton."""

    def __init__(self, peft_model, spec: LoraSpec, base_path: str | None = None,
                 base_names: dict[str, str] | None = None):
        self.model = peft_model
        self.spec = spec
        #: how the frozen base rests and streams: "nf4" or "native" (``spec.base_format`` with auto decided)
        self.base_format = resolve_base_format(spec.base_format, base_path)
        #: base weights (peft names) that stay native under nf4: those a 4-bit model directory keeps unquantized
        self.keep_native: set[str] = set()
        self.base_path = base_path
        self.adapter = "default"
        self.peft_config = peft_model.peft_config[self.adapter]
        #: a base parameter's name in the unwrapped model -> its name in the peft model (prefix, ``.base_layer``)
        self.base_names = base_names or {}

    def peft_name(self, base_name: str) -> str:
        """The peft model's name of base parameter ``base_name`` (a name of the unwrapped model)."""
        name = self.base_names.get(base_name)
        if name is None:
            raise ValueError(f"lora: base parameter {base_name!r} has no counterpart in the peft model")
        return name

    def mark_base(self, tensors: dict) -> None:
        """Mark the frozen weights that rest as NF4 in ``tensors`` (find_units' TensorInfo by canonical name)."""
        if self.base_format != "nf4":
            return
        for name in nf4.linear_weights(self.model) - self.keep_native:
            info = tensors.get(name)
            if info is not None and not info.trainable:
                info.nf4 = True

    def keep_unquantized(self, keys, reader) -> None:
        """Under nf4, keep native the base weights a 4-bit model directory holds unquantized (``keys``: the base's
        CheckpointKeys, ``reader``: its reader)."""
        if isinstance(reader, nf4.DequantizingReader):
            self.keep_native = {self.peft_name(g.first) for g in keys.groups
                                if g.first in self.base_names and not set(g.sources) & reader.quantized}

    def is_adapter(self, name: str) -> bool:
        return ".lora_" in name

    def file_key(self, name: str) -> str:
        """The key of adapter tensor ``name`` in a peft adapter file."""
        return name.replace(f".{self.adapter}.", ".")

    def adapter_names(self, tensors: dict) -> dict[str, str]:
        return {n: self.file_key(n) for n in sorted(tensors, key=lambda n: tensors[n].index) if self.is_adapter(n)}

    def spec_dict(self) -> dict:
        out = dataclasses.asdict(self.spec)
        out["base_format"] = self.base_format  # as decided: a resumed run streams the base it trained on
        out["target_modules"] = (list(self.spec.target_modules) if not isinstance(self.spec.target_modules, str)
                                 else self.spec.target_modules)
        return out

    def write_config(self, directory: Path) -> None:
        self.peft_config.save_pretrained(str(directory))
        cfg_path = Path(directory) / "adapter_config.json"
        cfg = json.loads(cfg_path.read_text())
        if self.base_path:
            # the base as a path that holds from any directory (a relative one would name another model, or
            # none, once the adapter is loaded elsewhere)
            base = str(self.base_path)
            cfg["base_model_name_or_path"] = os.path.abspath(base) if os.path.exists(base) else base
            cfg_path.write_text(json.dumps(cfg, indent=2))
        marker = Path(directory) / nf4.BASE_FORMAT_FILE
        if self.base_format == "nf4":
            marker.write_text(json.dumps({"base_format": "nf4", "quant_type": nf4.QUANT_TYPE,
                                          "blocksize": nf4.BLOCKSIZE}, indent=2) + "\n")
        elif marker.exists():
            marker.unlink()

    def initial_adapter(self, model, units, tensors, names: list[str], seed: int):
        """(name, tensor) for adapter tensors: from ``spec.init_from`` or peft's own initialization."""
        if self.spec.init_from:
            yield from self._from_file(tensors, names)
            return
        yield from self._peft_init(units, names, seed)

    def _from_file(self, tensors, names):
        from terastack.training.hf.model_files import CheckpointReader

        path = Path(self.spec.init_from)
        file = path / "adapter_model.safetensors"
        if not file.exists():
            raise FileNotFoundError(f"lora.init_from: {file} does not exist")
        reader = CheckpointReader.of_file(file)
        for name in names:
            key = self.file_key(name)
            if key not in reader.files:
                raise ValueError(f"lora.init_from: {file} has no tensor {key!r} (adapter of another model or "
                                 "other target modules?)")
            t = reader.get(key).to(torch.float32)
            if tuple(t.shape) != tensors[name].shape:
                raise ValueError(f"lora.init_from: {key!r} has shape {tuple(t.shape)}, the adapter expects "
                                 f"{tensors[name].shape} (another rank?)")
            yield name, t

    def _peft_init(self, units, names, seed: int):
        from terastack.training.hf.model_files import materialized, seeded

        wanted = set(names)
        with seeded(seed):
            for unit in units:
                for mod in unit.module.modules():
                    if not hasattr(mod, "reset_lora_parameters") or self.adapter not in getattr(mod, "lora_A", {}):
                        continue
                    with materialized([mod.lora_A[self.adapter], mod.lora_B[self.adapter]]), torch.no_grad():
                        mod.reset_lora_parameters(self.adapter, self.peft_config.init_lora_weights)
                        prefix = _local_prefix(unit.module, mod)
                        for lname, cname in unit.tensors.items():
                            if cname in wanted and lname.startswith(prefix):
                                wanted.discard(cname)
                                yield cname, unit.module.get_parameter(lname).detach().clone()
        if wanted:
            raise ValueError(f"no peft initialization found for adapter tensors {sorted(wanted)[:3]}")


def _local_prefix(root: nn.Module, target: nn.Module) -> str:
    for name, mod in root.named_modules():
        if mod is target:
            return f"{name}." if name else ""
    raise KeyError("module not inside its unit")


def default_target_modules(model) -> list[str] | str:
    """peft's default LoRA targets for the model's family. peft gets no default through for the MoE families
    transformers 5 converts (its config conversion turns a missing target list into an empty one), so terastack
    passes the default explicitly; for a family peft lists none for (Qwen3-MoE), the attention query and value
    projections -- peft's default of every Llama-like family -- when the model has modules of those names."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    model_type = getattr(model.config, "model_type", None)
    targets = DEFAULTS.get(model_type)
    if targets is not None:
        return targets if isinstance(targets, str) else list(targets)
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if {"q_proj", "v_proj"} <= leaves:
        return ["q_proj", "v_proj"]
    raise ValueError(f"lora.target_modules: peft has no default target modules for {model_type}; name the modules "
                     "to adapt (lora.target_modules in the [trainer.lora] table of a --config file)")


def resolve_base_format(value: str, base_path: str | None) -> str:
    """``lora.base_format`` decided: auto is nf4 for a bitsandbytes-quantized model directory, else native."""
    if value != "auto":
        return value
    if base_path is not None and os.path.isdir(base_path) and nf4.quantized_format(base_path) == nf4.QUANT_TYPE:
        return "nf4"
    return "native"


def apply_lora(model, spec: LoraSpec, *, base_path: str | None = None):
    """Wrap the skeleton with peft LoRA adapters; returns (peft model, LoraHandle)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ValueError("lora: needs the peft package (pip install 'terastack[llm]')") from exc
    kwargs = {"r": spec.r, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout, "task_type": "CAUSAL_LM"}
    targets = spec.target_modules
    if spec.init_from:
        cfg_path = Path(spec.init_from) / "adapter_config.json"
        if not cfg_path.exists():
            raise FileNotFoundError(f"lora.init_from: {cfg_path} does not exist")
        saved = json.loads(cfg_path.read_text())
        kwargs.update(r=saved.get("r", spec.r), lora_alpha=saved.get("lora_alpha", spec.alpha),
                      lora_dropout=saved.get("lora_dropout", spec.dropout))
        targets = saved.get("target_modules") or "auto"
    if targets == "auto":
        targets = default_target_modules(model)
    kwargs["target_modules"] = targets if isinstance(targets, str) else list(targets)
    # the base parameters keep their objects inside peft's wrappers: identity maps the unwrapped names to peft's
    unwrapped: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        unwrapped.setdefault(id(p), name)
    try:
        with warnings.catch_warnings():
            # peft's PeftModel reads transformers' is_gradient_checkpointing, which transformers 5 deprecates for
            # is_activation_checkpointing: a FutureWarning on every LoRA run about code neither terastack's nor the
            # user's (and terastack never checkpoints activations through transformers)
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            peft_model = get_peft_model(model, LoraConfig(**kwargs))
    except ValueError as exc:
        raise ValueError(f"lora: {exc}") from None
    peft_model.train()
    wrapped: dict[int, str] = {}
    for name, p in peft_model.named_parameters(remove_duplicate=False):
        wrapped.setdefault(id(p), name)
    base_names = {name: wrapped[i] for i, name in unwrapped.items() if i in wrapped}
    return peft_model, LoraHandle(peft_model, spec, base_path, base_names)
