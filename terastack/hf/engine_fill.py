"""The engine's store filled from the Trainer's model ([Note: the Trainer's model is the skeleton] in
terastack.hf.model_source), and a peft model's LoRA as the engine's.

[Note: a peft model as the engine's LoRA]
The engine trains LoRA adapters on a frozen base as peft defines them (terastack.llm.lora): the Trainer's peft
model is that model already, so its adapters train in the engine as peft's would, and the base may rest and
stream as NF4 (``base_format="nf4"``, as ``terastack finetune --base-format nf4``; the adapter then trains
against the dequantized base, as QLoRA's does). Served: one LoRA adapter (``LoraConfig``) without DoRA, without
``modules_to_save`` and with ``bias="none"`` -- what the engine's LoRA equals peft's for.
"""
from __future__ import annotations

import torch

PEFT_PREFIX = "base_model.model."


def lora_of(source, base_format: str | None):
    """(the engine's LoraHandle, its LoraSpec) for a peft model ([Note: a peft model as the engine's LoRA]);
    (None, None) for a full fine-tune."""
    model = source.model
    if model is source.causal_lm:
        if base_format not in (None, "native", "auto"):
            raise ValueError(f"offload(): base_format={base_format!r} streams a frozen LoRA base; give the "
                             "SFTTrainer a peft_config (or the Trainer a PeftModel)")
        return None, None
    from terastack.llm.lora import LoraHandle
    from terastack.llm.trainer_config import LoraSpec

    configs = model.peft_config
    cfg = configs.get("default") if len(configs) == 1 else None
    what = None if cfg is None else str(getattr(cfg.peft_type, "value", cfg.peft_type))
    refused = [(cfg is None, f"{len(configs)} adapters"), (what != "LORA", f"a {what} adapter"),
               (bool(getattr(cfg, "use_dora", False)), "DoRA"),
               (bool(getattr(cfg, "modules_to_save", None)), f"modules_to_save={cfg and cfg.modules_to_save}"),
               (getattr(cfg, "bias", "none") != "none", f"bias={getattr(cfg, 'bias', None)!r}")]
    for bad, why in refused:
        if bad:
            raise ValueError(f"terastack.hf.offload: the peft model has {why}; served: one LoRA adapter named "
                             "'default' (LoraConfig) without DoRA, modules_to_save or trained biases")
    targets = cfg.target_modules
    spec = LoraSpec(r=cfg.r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                    target_modules=targets if isinstance(targets, str) else tuple(sorted(targets)),
                    base_format=base_format or "native")
    base_names = {n.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."): n
                  for n, _ in model.named_parameters() if ".lora_" not in n}
    return LoraHandle(model, spec, source.checkpoint_dir, base_names), spec


def fill(engine, source) -> None:
    """Every weight of ``source`` into the engine's store; a family the tests do not verify checked after."""
    from terastack.llm.engine.family_check import check_family, needs_check
    from terastack.llm.model import TESTED_FAMILIES
    from terastack.llm.weight_fill import fill_store

    rt = engine.runtime
    if source.tensors:
        _fill_from_memory(engine, source.tensors)
    else:
        fill_store(rt, engine.model, engine.units, engine.tensors, seed=engine.config.seed, source=source.reader,
                   source_keys=source.keys, lora=engine.lora, slicing=engine.slicing, room=engine.fill_room)
    if needs_check(engine.family, engine.config.check_family, TESTED_FAMILIES):
        engine.family_check = check_family(engine.model, engine.units, rt, family=engine.family,
                                           vocab_size=engine.hf_config.get_text_config().vocab_size,
                                           seq_len=engine.config.seq_len, seed=engine.config.seed)


def _fill_from_memory(engine, tensors: dict[str, torch.Tensor]) -> None:
    """The model's own tensors (canonical name -> tensor), each let go once written (the writes in flight bounded
    by the engine's room as a checkpoint's fill bounds them: beside them, one tensor made fp32 and its record)."""
    from terastack.llm.engine import store_layout as layout
    from terastack.llm.weight_fill import initial_writes

    rt = engine.runtime
    wanted = set(engine.tensors)
    held = 2 * 4 * max((t.numel() for t in tensors.values()), default=0)
    in_flight = initial_writes(rt, engine.fill_room, held)
    for name in list(tensors):
        tensor = tensors.pop(name)
        for part, rows in engine.slicing.split(name, tensor):
            wanted.discard(part)
            layout.put_initial(rt, part, rows.to(torch.float32), in_flight)
        del tensor
    if wanted:
        raise ValueError(f"terastack.hf.offload: the model has no weights for {sorted(wanted)[:3]}")
    in_flight.finish()
