"""``Trainer.save_pretrained``: a directory ``transformers`` (or, for LoRA, ``peft``) loads, streamed from the store."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from terastack.dtypes import WEIGHT_DTYPES, dtype_name, to_dtype
from terastack.training.hf.keys import export_layout
from terastack.training.hf.sharded_writer import (DEFAULT_MAX_SHARD_SIZE, copy_tokenizer_files, shard_limit, staged_dir,
                                                  write_safetensors_files)


def export_pretrained(trainer, path: str | os.PathLike, *, dtype: str | None = None,
                      max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (shards and their index above ``max_shard_size``: [Note:
    sharded export]), or a peft adapter for LoRA, and the tokenizer files into ``path``, atomically.

    Tensors are streamed one group at a time into the safetensors files: the model is never whole in memory.
    """
    target = torch.float32 if dtype is None else to_dtype(dtype, allowed=WEIGHT_DTYPES)
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
                      for _, run, shapes in export_layout(trainer.model, trainer.model_tensors())]
            write_safetensors_files(tmp, groups, max_shard_size=limit,
                                    total_parameters=sum(info.numel for info in trainer.tensors.values()))
            # the dtype the weights are written in (transformers loads in it); the trainer's config is untouched
            cfg = copy.deepcopy(trainer.hf_config)
            cfg.dtype = dtype_name(target)
            cfg.to_json_file(str(tmp / "config.json"))
        copy_tokenizer_files(getattr(trainer, "source_dir", None), tmp)
    return Path(path)
