"""Bad input gets a clear error naming what is wrong, and nothing on disk is damaged."""
import os

import pytest
import torch

from .llm_helpers import batches, make_model
from terastack.io import BudgetError
from terastack.llm import LoraSpec, Trainer, TrainerConfig


def test_missing_or_unusable_model_dir(tmp_path, trainer_config):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Trainer.from_pretrained(tmp_path / "nope", trainer_config())
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        Trainer.from_pretrained(tmp_path / "empty", trainer_config())


def test_pickle_checkpoints_are_not_read(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    os.remove(tmp_path / "model" / "model.safetensors")
    (tmp_path / "model" / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin.*pickle.*can run code"):
        Trainer.from_pretrained(tmp_path / "model", trainer_config())


def test_corrupt_safetensors(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    path = tmp_path / "model" / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage}" + b"\x00" * 64)
    with pytest.raises(ValueError, match=r"model.safetensors is corrupt"):
        Trainer.from_pretrained(tmp_path / "model", trainer_config())


def test_checkpoint_missing_a_tensor(tmp_path, trainer_config):
    from safetensors.torch import load_file, save_file

    make_model("llama", tmp_path / "model")
    path = tmp_path / "model" / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.2.self_attn.k_proj.weight"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="no tensor for parameter 'model.layers.2.self_attn.k_proj.weight'"):
        Trainer.from_pretrained(tmp_path / "model", trainer_config())
    assert not any((tmp_path / "store").glob("run-*"))  # the scratch store of the failed run is gone


def test_budget_too_small_for_one_layer(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    with pytest.raises(BudgetError) as info:
        Trainer.from_pretrained(tmp_path / "model", trainer_config(device_budget="64KiB"))
    assert info.value.budget == "device" and info.value.shortfall > 0
    assert "device budget exceeded" in str(info.value) and "short by" in str(info.value)
    with pytest.raises(BudgetError) as info:
        Trainer.from_pretrained(tmp_path / "model", trainer_config(host_budget="32KiB"))
    assert info.value.budget == "host" and "gradients in flight" in str(info.value)


def test_unusable_store_dir(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="store_dir .*a-file/sub is not usable"):
        Trainer.from_pretrained(tmp_path / "model", trainer_config(store_dir=str(blocker / "sub")))


def test_full_disk_is_refused_before_training(tmp_path, trainer_config, monkeypatch):
    import shutil

    make_model("llama", tmp_path / "model")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    with pytest.raises(OSError, match=r"store_dir .* has 4.00 KiB free; the plan keeps up to .* there"):
        Trainer.from_pretrained(tmp_path / "model", trainer_config(state_placement="ssd"))


def test_batch_larger_than_planned(tmp_path, trainer_config):
    make_model("llama", tmp_path / "model")
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        with pytest.raises(ValueError, match="exceeds the planned"):
            t.step(torch.zeros(4, 64, dtype=torch.long))
        with pytest.raises(ValueError, match=r"\(batch, seq\)"):
            t.step(torch.zeros(2, 2, 2, dtype=torch.long))
        t.step(batches(1)[0])  # still usable


@pytest.mark.parametrize("field,value,match", [
    ("lr", -1.0, "lr: must be >= 0"), ("betas", (0.9, 1.5), "betas"), ("max_grad_norm", 0.0, "max_grad_norm"),
    ("device_budget", "lots", "device_budget: cannot read"), ("activation_policy", "swap", "activation_policy"),
    ("dtype", "int8", "dtype"), ("prefetch_depth", -1, "prefetch_depth"), ("optimizer_chunk", 10, "optimizer_chunk"),
])
def test_config_fields_are_validated(field, value, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig(**{field: value})
    with pytest.raises(ValueError, match="lora.r"):
        LoraSpec(r=0)


def test_shipped_config_files_are_valid():
    from pathlib import Path

    import terastack.llm

    configs = sorted((Path(terastack.llm.__file__).parent / "configs").glob("*.toml"))
    assert configs, "no shipped configs"
    for path in configs:
        TrainerConfig.from_toml(path)


def test_toml_with_unknown_field(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[trainer]\nlr = 1e-4\nlearning_rate = 3\n")
    with pytest.raises(ValueError, match="c.toml: TrainerConfig: unknown setting .learning_rate."):
        TrainerConfig.from_toml(path)


def test_a_failed_update_is_reported_and_stops_the_trainer(tmp_path, trainer_config, monkeypatch):
    """A write failing in the background (here: a full disk) surfaces on the training thread with its cause;
    the trainer then refuses further steps instead of training on half-updated weights."""
    make_model("llama", tmp_path / "model")
    ids = batches(1)[0]
    with Trainer.from_pretrained(tmp_path / "model", trainer_config()) as t:
        def disk_full(records, **_):
            raise OSError(28, f"No space left on device (writing back {records[0]})")
        monkeypatch.setattr(t.store, "evict_many", disk_full)  # the optimizer's write-back of updated state
        with pytest.raises(RuntimeError, match="optimizer update failed: OSError.*No space left on device"):
            for _ in range(3):
                t.step(ids)
        with pytest.raises(RuntimeError, match="start again from its last checkpoint"):
            t.step(ids)
