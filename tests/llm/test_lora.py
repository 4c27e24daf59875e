"""LoRA through peft: only adapters (and their optimizer state) train, the base streams read-only."""
import pytest
import torch

from .llm_helpers import batches, make_model, offloaded_train, reference_train
from .test_families import save_family
from terastack.llm import LoraSpec, Trainer


#: peft's own default targets, named for Mixtral: under transformers 5 peft turns a missing target list of an MoE
#: family into an empty one (terastack names the default itself, lora.default_target_modules)
_TARGETS = {"mixtral": ["q_proj", "v_proj"]}


def _save_base(family: str, path) -> None:
    if family in ("llama", "gpt2"):
        make_model(family, path)
    else:  # GPT-NeoX: head stored as embed_out.weight; Mixtral: per-expert tensors stacked in the model
        save_family(family, path)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "mixtral"])
def test_lora_matches_peft_in_memory(family, tmp_path, trainer_config):
    from peft import LoraConfig, PeftModel, get_peft_model

    _save_base(family, tmp_path / "base")
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"))
    ref = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM",
                                          target_modules=_TARGETS.get(family)))
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


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_lora_default_targets_on_mixture_of_experts(family, tmp_path, trainer_config):
    """``--lora R`` on an MoE base: peft's default targets (the attention query and value projections where peft
    lists none), the stacked experts loaded through transformers' conversions and left frozen."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    save_family(family, tmp_path / "base")
    data = batches(2)
    with Trainer.from_pretrained(tmp_path / "base", trainer_config(lora=LoraSpec(r=2, alpha=4))) as t:
        adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in t.tensors if ".lora_" in n}
        assert adapted == {"q_proj", "v_proj"}
        experts = next(n for n in t.tensors if n.endswith("experts.gate_up_proj"))
        before = t.parameter(experts)
        losses = offloaded_train(t, data)
        assert all(torch.isfinite(torch.tensor(losses)))
        assert torch.equal(t.parameter(experts), before)  # frozen
        b = next(n for n in t.tensors if "lora_B" in n)
        assert t.parameter(b).abs().sum() > 0  # the adapters trained
        t.save_pretrained(tmp_path / "adapter")
        ids = data[0]
        expected = t.loss(ids)
    base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"))
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    assert loaded(input_ids=ids, labels=ids).loss.item() == pytest.approx(expected, abs=1e-5)


def test_wrapping_a_model_in_an_adapter_says_nothing_about_transformers_internals():
    """peft reads a transformers attribute that transformers 5 deprecates: that FutureWarning is not the user's
    business, and terastack silences exactly it where it calls peft; others still show."""
    import warnings

    from terastack.llm.lora import apply_lora
    from terastack.training.hf.model_files import build_skeleton

    from .llm_helpers import tiny_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(build_skeleton(tiny_config("llama")), LoraSpec(r=2))
        warnings.warn("still shown", FutureWarning)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == ["still shown"]
