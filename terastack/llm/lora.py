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
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from terastack.llm.config import LoraSpec

_PREFIX = "base_model.model."


class LoraHandle:
    """What the trainer needs to know about the adapters of a peft-wrapped skeleton."""

    def __init__(self, peft_model, spec: LoraSpec, base_path: str | None = None):
        self.model = peft_model
        self.spec = spec
        self.base_path = base_path
        self.adapter = "default"
        self.peft_config = peft_model.peft_config[self.adapter]

    def is_adapter(self, name: str) -> bool:
        return ".lora_" in name

    def base_key(self, keys: set[str], name: str, prefix: str) -> str | None:
        """The base checkpoint key of a frozen parameter (peft adds a prefix and ``.base_layer``)."""
        if self.is_adapter(name) or not name.startswith(_PREFIX):
            return None
        from terastack.llm.model import checkpoint_key

        base = name[len(_PREFIX):].replace(".base_layer.", ".")
        return checkpoint_key(keys, base, prefix or getattr(self.model.get_base_model(), "base_model_prefix", ""))

    def file_key(self, name: str) -> str:
        """The key of adapter tensor ``name`` in a peft adapter file."""
        return name.replace(f".{self.adapter}.", ".")

    def adapter_names(self, tensors: dict) -> dict[str, str]:
        return {n: self.file_key(n) for n in sorted(tensors, key=lambda n: tensors[n].index) if self.is_adapter(n)}

    def spec_dict(self) -> dict:
        out = dataclasses.asdict(self.spec)
        out["target_modules"] = (list(self.spec.target_modules) if not isinstance(self.spec.target_modules, str)
                                 else self.spec.target_modules)
        return out

    def write_config(self, directory: Path) -> None:
        self.peft_config.save_pretrained(str(directory))
        cfg_path = Path(directory) / "adapter_config.json"
        cfg = json.loads(cfg_path.read_text())
        if self.base_path and not cfg.get("base_model_name_or_path"):
            cfg["base_model_name_or_path"] = self.base_path
            cfg_path.write_text(json.dumps(cfg, indent=2))

    def initial_adapter(self, model, units, tensors, names: list[str], seed: int):
        """(name, tensor) for adapter tensors: from ``spec.init_from`` or peft's own initialization."""
        if self.spec.init_from:
            yield from self._from_file(tensors, names)
            return
        yield from self._peft_init(units, names, seed)

    def _from_file(self, tensors, names):
        from terastack.llm.model import CheckpointReader

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
        from terastack.llm.model import materialized, seeded

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


def apply_lora(model, spec: LoraSpec, *, base_path: str | None = None):
    """Wrap the skeleton with peft LoRA adapters; returns (peft model, LoraHandle)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ValueError("lora: needs the peft package (pip install 'terastack[llm]')") from exc
    kwargs = {"r": spec.r, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout, "task_type": "CAUSAL_LM"}
    if spec.init_from:
        cfg_path = Path(spec.init_from) / "adapter_config.json"
        if not cfg_path.exists():
            raise FileNotFoundError(f"lora.init_from: {cfg_path} does not exist")
        saved = json.loads(cfg_path.read_text())
        kwargs.update(r=saved.get("r", spec.r), lora_alpha=saved.get("lora_alpha", spec.alpha),
                      lora_dropout=saved.get("lora_dropout", spec.dropout),
                      target_modules=saved.get("target_modules"))
    elif spec.target_modules != "auto":
        kwargs["target_modules"] = list(spec.target_modules)
    try:
        peft_model = get_peft_model(model, LoraConfig(**kwargs))
    except ValueError as exc:
        raise ValueError(f"lora: {exc}") from None
    peft_model.train()
    return peft_model, LoraHandle(peft_model, spec, base_path)
