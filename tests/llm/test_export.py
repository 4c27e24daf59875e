"""``Trainer.save_pretrained`` writes what transformers' ``save_pretrained`` writes: one ``model.safetensors`` below
``max_shard_size``, above it ``model-0000i-of-0000N.safetensors`` shards and ``model.safetensors.index.json``,
tensor by tensor, atomically; transformers loads every form back."""
import json
import os

import pytest
import torch
from safetensors import safe_open

from terastack.llm import Trainer
from terastack.training.hf.sharded_writer import plan_shards

from .llm_helpers import AliveTensors, batches, make_model, offloaded_train
from .test_families import save_family

INDEX = "model.safetensors.index.json"


def _file_tensors(directory) -> dict[str, tuple[str, int]]:
    """{key: (file, bytes)} over every safetensors file of ``directory``."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with safe_open(str(directory / name), framework="pt") as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    out[key] = (name, t.numel() * t.element_size())
    return out


def _count_alive(trainer) -> AliveTensors:
    """Wrap ``trainer.parameter`` so that the tensors it handed out and that are still alive are counted."""
    counter, fetch = AliveTensors(), trainer.parameter
    trainer.parameter = lambda name: counter.track(fetch(name))
    return counter


def _check_sharded(out, limit: int) -> dict:
    index = json.loads((out / INDEX).read_text())
    assert set(index) == {"metadata", "weight_map"}
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n > 1 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert not (out / "model.safetensors").exists()
    held = _file_tensors(out)
    assert {k: f for k, (f, _) in held.items()} == index["weight_map"]  # the index says where each tensor is
    assert index["metadata"]["total_size"] == sum(b for _, b in held.values())
    for name in files:  # a shard is within the limit unless it holds one tensor larger than the limit
        sizes = [b for f, b in held.values() if f == name]
        assert sum(sizes) <= limit or len(sizes) == 1
    return index


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_sharded_export_loads_in_transformers_and_matches_its_own_sharding(family, tmp_path, trainer_config):
    from transformers import AutoModelForCausalLM

    if family == "llama":
        ref = make_model("llama", tmp_path / "model", layers=2)
    else:  # per-expert tensors in the file, stacked in the model: conversion groups cross shard boundaries
        ref = save_family("mixtral", tmp_path / "model")
    limit = 10_000  # the 96 x 32 fp32 embedding (12288 bytes) is larger: a shard of its own
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        offloaded_train(t, batches(2))
        stats = _count_alive(t)
        t.save_pretrained(tmp_path / "out", max_shard_size=limit)
        calls, peak = stats.calls, stats.peak
        trained = {n: t.parameter(n) for n in t.tensors}
    # tensor by tensor: every parameter read once, and never more than one alive at a time
    assert calls == len(trained) and peak == 1
    index = _check_sharded(tmp_path / "out", limit)
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in trained.values())
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    params = dict(loaded.named_parameters())
    assert sorted(params) == sorted(trained)
    for name, p in params.items():
        assert torch.equal(p.detach(), trained[name]), name
    # transformers' own sharded save of the same model: the same keys, the same index shape and total size
    for name, p in ref.named_parameters():
        p.data.copy_(trained[name])
    ref.save_pretrained(str(tmp_path / "ref"), max_shard_size=limit)
    ref_index = json.loads((tmp_path / "ref" / INDEX).read_text())
    assert set(ref_index) == set(index)
    assert set(ref_index["weight_map"]) == set(index["weight_map"])
    assert ref_index["metadata"] == index["metadata"]
    assert all(f.endswith(f"-of-{len(set(index['weight_map'].values())):05d}.safetensors")
               for f in index["weight_map"].values())


def test_below_the_shard_size_one_file_and_bfloat16_loads_as_bfloat16(tmp_path, trainer_config):
    from transformers import AutoModelForCausalLM

    make_model("qwen2", tmp_path / "model", layers=2)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        offloaded_train(t, batches(1))
        t.save_pretrained(tmp_path / "one")  # default 5GB: one file, no index
        t.save_pretrained(tmp_path / "bf16", dtype="bfloat16", max_shard_size="20KB")
        trained = {n: t.parameter(n) for n in t.tensors}
    assert (tmp_path / "one" / "model.safetensors").exists() and not (tmp_path / "one" / INDEX).exists()
    assert json.loads((tmp_path / "one" / "config.json").read_text())["dtype"] == "float32"
    index = _check_sharded(tmp_path / "bf16", 20_000)
    assert index["metadata"]["total_size"] == sum(p.numel() * 2 for p in trained.values())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"))
    for name, p in loaded.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), trained[name].to(torch.bfloat16)), name


def test_failed_export_leaves_the_previous_directory(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model", layers=2)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        t.save_pretrained(tmp_path / "out", max_shard_size="10KB")
        before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
        fetch, calls = t.parameter, []

        def failing(name):
            calls.append(name)
            if len(calls) == 7:  # a few shards in
                raise OSError("disk went away")
            return fetch(name)

        t.parameter = failing
        with pytest.raises(OSError, match="disk went away"):
            t.save_pretrained(tmp_path / "out", max_shard_size="10KB", dtype="bfloat16")
        with pytest.raises(ValueError, match="max_shard_size"):
            t.save_pretrained(tmp_path / "out", max_shard_size="lots")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("seed", range(5))
def test_shard_plan_is_huggingface_hubs(seed):
    """Without a tensor above the limit the plan is huggingface_hub's split (the one transformers uses)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    g = torch.Generator().manual_seed(seed)
    sizes = [(f"t{i:03d}", int(torch.randint(1, 60, (), generator=g)) * 4) for i in range(40)]
    state = {k: torch.empty(b // 4) for k, b in sizes}
    ref = split_torch_state_dict_into_shards(state, max_shard_size=240)
    assert [list(v) for v in ref.filename_to_tensors.values()] == plan_shards(sizes, 240)
