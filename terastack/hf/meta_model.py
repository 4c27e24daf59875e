"""``terastack.hf.empty_model``: a causal LM a Trainer is built around without its weights in memory.

    model = terastack.hf.empty_model("/models/llama-70b")          # or a Hub id in the local cache
    trainer = SFTTrainer(model=model, args=..., peft_config=LoraConfig(...), train_dataset=data)
    terastack.hf.offload(trainer, store="/nvme/run", memory_budget="24GiB", base_format="nf4")

The model is transformers' own class for the checkpoint's config, with every parameter on the meta device (no
memory) and its buffers real; it remembers its checkpoint directory, from which ``offload`` fills the store one
tensor at a time, as ``terastack finetune`` does ([Note: the Trainer's model is the skeleton] in
terastack.hf.model_source). Its weights are nowhere else: train it through ``offload``. A Trainer places a model
on its device when it is built; an empty model says, as accelerate's own offloaded models do, that its weights
are on the disk (``hf_device_map = {"": "disk"}``), and the Trainer leaves it where it is.
"""
from __future__ import annotations

import os

from terastack.hf.model_source import BASE_FORMAT_ATTR, SOURCE_ATTR

#: from_pretrained's keywords that change what is built here (the others, about where files come from or how
#: fast they load, do not apply: nothing is loaded)
CONFIG_KWARGS = ("attn_implementation",)
#: keywords that say nothing about the model built (how or where from_pretrained would load it)
IGNORED_KWARGS = ("low_cpu_mem_usage", "device_map", "use_safetensors", "local_files_only", "cache_dir",
                  "token", "force_download")


def empty_model(path_or_hub_id: str | os.PathLike, **from_pretrained_kwargs):
    """The causal LM of the checkpoint at ``path_or_hub_id`` (a local directory with safetensors, or a Hub id
    ``ORG/NAME`` found in the local Hugging Face cache or downloaded as ``terastack finetune --model`` does), with
    no weights in memory (a directory with a config alone: a random initialization, made in the store). ``from_pretrained_kwargs``: ``dtype`` / ``torch_dtype`` (the engine's compute dtype is
    TrainingArguments' bf16; the model is built in float32) and ``attn_implementation`` are read; ``revision``
    picks the Hub revision; a ``quantization_config`` with 4-bit NF4 says the LoRA base rests as NF4
    (``base_format`` "nf4" at ``offload``); ``trust_remote_code`` is refused (code from the checkpoint)."""
    from terastack.training.hf.model_files import build_skeleton, load_hf_config

    kwargs = dict(from_pretrained_kwargs)
    if kwargs.pop("trust_remote_code", False):
        raise ValueError("empty_model: trust_remote_code=True is not served (the model's code would come from the "
                         "checkpoint); use a family transformers ships")
    path = _local_dir(str(path_or_hub_id), kwargs.pop("revision", None))
    config = load_hf_config(path)
    for key in CONFIG_KWARGS:
        if kwargs.get(key) is not None:
            setattr(config, f"_{key}" if key == "attn_implementation" else key, kwargs.pop(key))
    quantization = kwargs.pop("quantization_config", None)
    for key in ("dtype", "torch_dtype", *IGNORED_KWARGS):
        kwargs.pop(key, None)
    if kwargs:
        raise ValueError(f"empty_model: {sorted(kwargs)[0]}= is not a from_pretrained keyword empty_model reads "
                         f"(it reads dtype, attn_implementation, revision, quantization_config)")
    model = build_skeleton(config)
    setattr(model, SOURCE_ATTR, path)
    model.hf_device_map = {"": "disk"}
    if quantization is not None:
        setattr(model, BASE_FORMAT_ATTR, _base_format(quantization))
    return model


def _local_dir(spec: str, revision: str | None) -> str:
    from terastack.training.hf import hub

    if os.path.isdir(spec):
        return spec
    if hub.is_hub_id(spec, sep="@"):
        return str(hub.model_dir(f"{spec}@{revision}" if revision else spec))
    raise FileNotFoundError(f"empty_model: {spec} is neither a model directory nor a Hugging Face Hub id")


def _base_format(quantization) -> str:
    """The LoRA base format a bitsandbytes quantization config asks for (4-bit NF4 only)."""
    get = quantization.get if isinstance(quantization, dict) else (lambda k, d=None: getattr(quantization, k, d))
    if get("load_in_4bit", False) and get("bnb_4bit_quant_type", "fp4") == "nf4":
        return "nf4"
    raise ValueError("empty_model: quantization_config: served is bitsandbytes' 4-bit NF4 (load_in_4bit=True, "
                     "bnb_4bit_quant_type='nf4') for a LoRA base")
