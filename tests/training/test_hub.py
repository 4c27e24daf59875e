"""Hugging Face Hub ids for the model and the data, resolved from a local cache in the hub's own layout with the
network off (nothing is downloaded in tests): ``--model ORG/NAME[@revision]``, ``--data ORG/NAME[:split]``."""
import json

import pytest

from terastack.training.hf import hub
from terastack.training.model_registry import resolve_model


def _snapshot(cache, kind, repo, sha="0123456789abcdef0123456789abcdef01234567"):
    """The cache folders ``huggingface_hub`` itself writes: ``{kind}s--ORG--NAME/{refs/main, snapshots/SHA/}``."""
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    return snap


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_model_id_resolves_from_the_cache_offline(offline_cache, tmp_path):
    from transformers import AutoModelForCausalLM

    from terastack.training.model_registry import hf_config

    snap = _snapshot(offline_cache, "model", "acme/tiny")
    AutoModelForCausalLM.from_config(hf_config("tiny-llama")).save_pretrained(str(snap))
    for spec in ("acme/tiny", "acme/tiny@main"):
        config, model_dir = resolve_model(spec)
        assert config.model_type == "llama" and model_dir is not None
        assert (hub.model_dir(spec) / "model.safetensors").exists()
    with pytest.raises(ValueError) as err:
        resolve_model("acme/absent")
    assert "acme/absent" in str(err.value) and str(offline_cache) in str(err.value)
    # a missing local path is a missing path, never a Hub look-up
    assert not hub.is_hub_id("data/train.jsonl", sep=":") and not hub.is_hub_id(str(tmp_path), sep="@")
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "missing" / "model"))


def test_a_data_set_id_resolves_to_its_split_file(offline_cache):
    snap = _snapshot(offline_cache, "dataset", "acme/chat")
    (snap / "data").mkdir()
    for split in ("train", "validation"):
        (snap / "data" / f"{split}.jsonl").write_text(json.dumps({"prompt": "p", "completion": split}) + "\n")
    assert hub.data_file("acme/chat").endswith("data/train.jsonl")
    assert hub.data_file("acme/chat:validation").endswith("data/validation.jsonl")
    with pytest.raises(ValueError) as err:
        hub.data_file("acme/chat:test")
    assert "'test'" in str(err.value) and "train.jsonl" in str(err.value)


def test_finetune_takes_hub_ids_offline(offline_cache, tmp_path, capsys, monkeypatch):
    """The whole job from Hub ids: the model and the data set come from the cache, the run trains and exports."""
    from transformers import AutoModelForCausalLM

    from terastack.cli import main
    from terastack.training.model_registry import hf_config

    AutoModelForCausalLM.from_config(hf_config("tiny-llama")).save_pretrained(
        str(_snapshot(offline_cache, "model", "acme/tiny")))
    snap = _snapshot(offline_cache, "dataset", "acme/pairs")
    (snap / "train.jsonl").write_text("".join(json.dumps({"prompt": f"q{i} ", "completion": f"answer {i}"}) + "\n"
                                              for i in range(12)))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(["finetune", "--model", "acme/tiny", "--data", "acme/pairs", "--steps", "2", "--seq-len", "32",
                 "--batch-size", "2", "--json", "--store", str(tmp_path / "store")]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["steps"] == 2 and "train.jsonl" in r["data"]["source"]
