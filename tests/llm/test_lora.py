"""LoRA through peft: only adapters (and their optimizer state) train, the base streams read-only."""
import pytest
import torch

from .llm_helpers import batches, make_model, offloaded_train, reference_train
from terastack.llm import LoraSpec, Trainer


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_lora_matches_peft_in_memory(family, tmp_path, trainer_config):
    from peft import LoraConfig, PeftModel, get_peft_model

    make_model(family, tmp_path / "base")
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"))
    ref = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
    with torch.no_grad():  # non-zero B so the adapters change the output from the first step
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ref.save_pretrained(str(tmp_path / "adapter0"))
    ref.train()
    data = batches(3)
    cfg = trainer_config(lora=LoraSpec(init_from=str(tmp_path / "adapter0")), activation_policy="keep,recompute")
    with Trainer.from_pretrained(tmp_path / "base", cfg) as t:
        trainable = {n for n, info in t.tensors.items() if info.trainable}
        assert trainable and all(".lora_" in n for n in trainable)
        assert not any(r.startswith(("m:", "v:", "p:")) and ".lora_" not in r for r in t.store.names())
        offloaded_train(t, data)
        reference_train(ref, data)
        diffs = [(t.parameter(n) - p.detach()).abs().max().item() for n, p in ref.named_parameters()]
        assert max(diffs) <= 1e-5  # adapters trained alike, the base untouched
        t.save_pretrained(tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")),
                                       str(tmp_path / "adapter"))
    ref.eval()
    loaded.eval()
    assert torch.allclose(loaded(input_ids=data[0]).logits, ref(input_ids=data[0]).logits, atol=1e-5)


def test_lora_with_peft_initialization_and_checkpoint(tmp_path, trainer_config):
    make_model("qwen2", tmp_path / "base")
    data = batches(3)
    cfg = trainer_config(lora=LoraSpec(r=2, alpha=4))
    with Trainer.from_pretrained(tmp_path / "base", cfg) as t:
        names = [n for n, i in t.tensors.items() if i.trainable]
        a = t.parameter(next(n for n in names if "lora_A" in n))
        b = t.parameter(next(n for n in names if "lora_B" in n))
        assert a.abs().sum() > 0 and b.abs().sum() == 0  # peft's init: A random, B zero
        t.step(data[0])
        t.save_checkpoint(tmp_path / "ckpt")
        for ids in data[1:]:
            t.step(ids)
        expected = {n: t.parameter(n) for n in names}
    with Trainer.load_checkpoint(tmp_path / "ckpt", trainer_config()) as r:
        assert r.lora is not None
        for ids in data[1:]:
            r.step(ids)
        assert all(torch.equal(r.parameter(n), expected[n]) for n in names)
