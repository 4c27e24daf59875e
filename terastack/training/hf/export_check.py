"""Check an exported model directory without holding the model in memory (a 3B export is 13 GB).

transformers' own model class is built from the exported ``config.json`` on the meta device; the file's keys
go through transformers' key conversions (:class:`terastack.training.hf.keys.CheckpointKeys`, as loading does) on
meta tensors of the shapes in the safetensors header, so every parameter of the model must be produced, with
its shape, and no key may be left over. Then a few tensors (the first, middle and last groups) are read one
group at a time and compared with the trainer's own copies.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from terastack.training.hf.keys import CheckpointKeys
from terastack.training.hf.model_files import CheckpointReader, build_skeleton, load_hf_config


def check_export(path: str | os.PathLike, parameter: Callable[[str], torch.Tensor], *, samples: int = 3,
                 atol: float = 0.0) -> list[str]:
    """Raise ``ValueError`` naming the first mismatch of the export in ``path``; ``parameter(name)`` gives the
    expected fp32 tensor of a canonical parameter. Returns the names whose values were compared."""
    skeleton = build_skeleton(load_hf_config(path))
    reader = CheckpointReader(path)
    try:
        shapes = {key: reader.info(key)[0] for key in reader.files}  # the headers only: no tensor is read
        keys = CheckpointKeys(skeleton, list(shapes))
        if keys.unused:
            raise ValueError(f"{path}: keys no parameter of the model takes: {keys.unused[:4]}")
        expected = {name: tuple(p.shape) for name, p in skeleton.named_parameters()}
        produced = dict(keys.tensors(lambda k: torch.empty(shapes[k], device="meta")))
        missing = sorted(set(expected) - set(produced))
        if missing:
            raise ValueError(f"{path}: no tensor for parameter {missing[0]!r} ({len(missing)} missing)")
        for name, t in produced.items():
            if tuple(t.shape) != expected[name]:
                raise ValueError(f"{path}: parameter {name!r} has shape {tuple(t.shape)}, the model "
                                 f"{expected[name]}")
        groups = keys.groups
        picked = sorted({0, len(groups) // 2, len(groups) - 1})[:samples]
        compared = []
        for i in picked:
            for name, tensor in groups[i].run(skeleton, reader.get).items():
                cname = keys.canonical[name]
                want = parameter(cname)
                got = tensor.to(torch.float32)
                # bit-equality needs no temporaries the size of the tensor (the largest are hundreds of MB)
                same = got.shape == want.shape and (torch.equal(got, want) if atol == 0
                                                    else torch.allclose(got, want, rtol=0, atol=atol))
                if not same:
                    diff = (got - want).abs().max().item() if got.shape == want.shape else None
                    raise ValueError(f"{path}: parameter {cname!r} differs from the trainer's (max |diff| {diff})")
                compared.append(cname)
    finally:
        reader.close()
    return compared
