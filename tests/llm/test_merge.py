"""``terastack merge``: a peft LoRA adapter merged into its base equals peft's ``merge_and_unload()``, streamed
tensor by tensor from a sharded or single-file base, written as transformers loads it; bad adapters and
mismatched bases fail with one line naming the file."""
import json

import pytest
import torch
from safetensors import safe_open

from terastack.cli import main
from terastack.training.hf.merge import merge_adapter
from terastack.training.hf.model_files import CheckpointReader

from .llm_helpers import VOCAB, AliveTensors, make_model
from .test_families import save_family

INDEX = "model.safetensors.index.json"


def _keys(directory) -> set[str]:
    if (directory / INDEX).exists():
        return set(json.loads((directory / INDEX).read_text())["weight_map"])
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def _adapter(base_dir, out, seed=3, **lora):
    """A peft adapter of the model in ``base_dir`` with random (non-zero) A and B, saved to ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base_dir)),
                           LoraConfig(task_type="CAUSAL_LM", **lora))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(str(out))


def _reference(base_dir, adapter_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_dir)),
                                     str(adapter_dir)).merge_and_unload()


CASES = {
    # rsLoRA, per-module rank and alpha, an adapted embedding; the base sharded with an index
    "llama": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj", "embed_tokens"],
                  rank_pattern={"v_proj": 2}, alpha_pattern={"q_proj": 3}),
    # Conv1D layers (fan_in_fan_out)
    "gpt2": dict(r=4, lora_alpha=16, target_modules=["c_attn", "c_fc"]),
    # the adapted head is lm_head in the model, embed_out.weight in the file
    "gpt_neox": dict(r=2, lora_alpha=4, target_modules=["query_key_value", "lm_head"]),
    # per-expert tensors in the file, stacked in the model: copied through as the base stores them
    "mixtral": dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
}


@pytest.mark.parametrize("family", list(CASES))
def test_merge_equals_peft_merge_and_unload(family, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    if family in ("gpt_neox", "mixtral"):
        save_family(family, base)
    else:
        make_model(family, tmp_path / "b0", layers=2)
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "b0")).save_pretrained(
            str(base), max_shard_size="16KB" if family == "llama" else "5GB")
    (base / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    _adapter(base, tmp_path / "adapter", **CASES[family])
    rc = main(["merge", "--base", str(base), "--adapter", str(tmp_path / "adapter"), "--output", str(tmp_path / "out"),
               "--max-shard-size", "20KB"])
    assert rc == 0 and "merged" in capsys.readouterr().out
    out = tmp_path / "out"
    assert _keys(out) == _keys(base)  # the base's own keys (GPT-NeoX: embed_out.weight)
    assert (out / INDEX).exists() and not (out / "model.safetensors").exists()
    assert (out / "tokenizer_config.json").read_text() == (base / "tokenizer_config.json").read_text()
    assert json.loads((out / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    ref = dict(_reference(base, tmp_path / "adapter").named_parameters())
    loaded = dict(AutoModelForCausalLM.from_pretrained(str(out)).named_parameters())
    assert sorted(loaded) == sorted(ref)
    plain = dict(AutoModelForCausalLM.from_pretrained(str(base)).named_parameters())
    changed = [n for n in ref if not torch.equal(ref[n], plain[n])]
    assert changed  # the adapter changed something, and ours changed exactly that, to peft's values
    for name, p in loaded.items():
        assert torch.equal(p, ref[name]), name


def test_merge_to_bfloat16_streams_the_base_one_tensor_at_a_time(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    make_model("qwen2", tmp_path / "base", layers=2)
    _adapter(tmp_path / "base", tmp_path / "adapter", r=4, lora_alpha=8)
    base_reads, get = AliveTensors(), CheckpointReader.get

    def counting(self, key):
        t = get(self, key)
        return base_reads.track(t) if self.path == tmp_path / "base" else t

    monkeypatch.setattr(CheckpointReader, "get", counting)
    result = merge_adapter(tmp_path / "base", tmp_path / "adapter", tmp_path / "out", dtype="bfloat16")
    assert base_reads.calls == len(_keys(tmp_path / "base")) and base_reads.peak == 1
    assert result.files == ["model.safetensors"] and result.updated_keys
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    ref = dict(_reference(tmp_path / "base", tmp_path / "adapter").named_parameters())
    for name, p in AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, ref[name].to(torch.bfloat16)), name


def _fails(capsys, *argv) -> str:
    capsys.readouterr()  # what came before (transformers' progress bars)
    rc = main(["merge", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_adapters_and_mismatched_bases_fail_in_one_line(tmp_path, capsys):
    make_model("llama", tmp_path / "base", layers=2)
    _adapter(tmp_path / "base", tmp_path / "adapter", r=2, lora_alpha=4)
    out = tmp_path / "out"
    common = ["--output", str(out)]
    # not an adapter directory
    (tmp_path / "empty").mkdir()
    err = _fails(capsys, "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "empty"), *common)
    assert str(tmp_path / "empty" / "adapter_config.json") in err
    # the adapter of another model: its modules are not in this base ...
    make_model("gpt2", tmp_path / "gpt2", layers=2)
    err = _fails(capsys, "--base", str(tmp_path / "gpt2"), "--adapter", str(tmp_path / "adapter"), *common)
    assert str(tmp_path / "adapter" / "adapter_model.safetensors") in err and "no weight" in err
    # ... or of another size of the same family
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=VOCAB)).save_pretrained(str(tmp_path / "wide"))
    err = _fails(capsys, "--base", str(tmp_path / "wide"), "--adapter", str(tmp_path / "adapter"), *common)
    assert "adapter_model.safetensors" in err and "[48, 48]" in err
    # an option the merge refuses by name; a corrupt config; a corrupt weights file
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    for field, value, expect in (("use_dora", True, "use_dora"), ("init_lora_weights", "pissa", "init_lora_weights"),
                                 ("bias", "all", "bias")):
        (tmp_path / field).mkdir()
        (tmp_path / field / "adapter_model.safetensors").write_bytes(
            (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes())
        (tmp_path / field / "adapter_config.json").write_text(json.dumps({**cfg, field: value}))
        err = _fails(capsys, "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / field), *common)
        assert expect in err and "adapter_config.json" in err
    (tmp_path / "bias" / "adapter_config.json").write_text("{not json")
    err = _fails(capsys, "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "bias"), *common)
    assert str(tmp_path / "bias" / "adapter_config.json") in err
    (tmp_path / "use_dora" / "adapter_config.json").write_text(json.dumps(cfg))
    (tmp_path / "use_dora" / "adapter_model.safetensors").write_bytes(b"\x00" * 40)
    err = _fails(capsys, "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "use_dora"), *common)
    assert str(tmp_path / "use_dora" / "adapter_model.safetensors") in err
    # the output may not replace the base; nothing was written by any failed merge
    err = _fails(capsys, "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"),
                 "--output", str(tmp_path / "base"))
    assert "base" in err
    assert not out.exists() and not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


def test_merge_never_replaces_a_directory_of_other_files(tmp_path, capsys):
    """A mistyped --output naming a directory of the user's own files is refused, and the files stay; an earlier
    export in the same place is replaced (a second merge into the first one's output)."""
    make_model("llama", tmp_path / "base", layers=2)
    _adapter(tmp_path / "base", tmp_path / "adapter", r=2, lora_alpha=4)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "notes.txt").write_text("important")
    args = ("--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"))
    err = _fails(capsys, *args, "--output", str(scratch))
    assert str(scratch) in err and "not a model export" in err
    assert sorted(p.name for p in scratch.iterdir()) == ["notes.txt"]
    assert (scratch / "notes.txt").read_text() == "important"
    merged = tmp_path / "merged"
    assert main(["merge", *args, "--output", str(merged)]) == 0
    assert main(["merge", *args, "--output", str(merged)]) == 0   # an export may be replaced by a new one
    assert (merged / "config.json").exists()
