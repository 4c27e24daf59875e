"""A random initialization in bounded memory: a unit initialized one module at a time draws what the whole unit
draws, for every family the tests verify, and one whose module leaves a parameter to its parent is refused by
name; a LoRA model from a config trains its adapters on the plain model's random base (NF4-rounded under nf4)
exactly as peft does over that base."""
import pytest
import torch

from .llm_helpers import batches, offloaded_train, reference_train, tiny_config
from .test_families import FAMILIES, family_config
from terastack.llm import LoraSpec, Trainer
from terastack.llm import model as model_module
from terastack.llm.model import find_units, random_init
from terastack.training.hf.model_files import build_skeleton

F = pytest.importorskip("bitsandbytes.functional")
pytest.importorskip("peft")

#: the frozen base and the adapters' state on the SSD (the base streams from it as it rests)
BUDGETS = dict(device_budget="1MiB", host_budget="128KiB", state_placement="ssd")
RTOL = 1e-5


def _init(cfg, seed: int) -> dict[str, torch.Tensor]:
    model = build_skeleton(cfg)
    units, tensors = find_units(model)
    return dict(random_init(model, units, tensors, seed))


#: GPT-2 rescales its projections from the enclosing module's initialization: exact in parts only where those
#: modules are parts whole (below)
EXACT_IN_PARTS = [f for f in FAMILIES if f != "gpt2"]


@pytest.mark.parametrize("family", EXACT_IN_PARTS)
def test_one_module_at_a_time_draws_what_the_whole_unit_draws(family, monkeypatch):
    cfg = family_config(family)
    whole = _init(cfg, seed=5)
    monkeypatch.setattr(model_module, "WHOLE_UNIT_INIT_BYTES", 0)  # every module its own part
    parts = _init(cfg, seed=5)
    assert list(parts) == list(whole)
    for name, value in whole.items():
        assert torch.equal(parts[name], value), name
    assert any(v.std() > 0 for v in whole.values())


def test_gpt2_in_parts_equals_the_whole_unit_where_its_blocks_children_fit_and_is_refused_below(monkeypatch):
    cfg = family_config("gpt2")
    whole = _init(cfg, seed=5)
    block = build_skeleton(cfg).transformer.h[0]
    fits = 4 * max(sum(p.numel() for p in child.parameters()) for child in block.children())
    monkeypatch.setattr(model_module, "WHOLE_UNIT_INIT_BYTES", fits)  # each block split, its children whole
    parts = _init(cfg, seed=5)
    assert all(torch.equal(parts[name], value) for name, value in whole.items())
    monkeypatch.setattr(model_module, "WHOLE_UNIT_INIT_BYTES", 0)
    with pytest.raises(ValueError, match="GPT2Attention in unit transformer.h.0 sets its submodules' parameters"):
        _init(cfg, seed=5)


def _llama_with_init(monkeypatch, replace):
    from transformers.models.llama.modeling_llama import LlamaMLP

    model = build_skeleton(tiny_config("llama", layers=2))
    units, tensors = find_units(model)
    own = model._init_weights
    ups = {id(m.up_proj) for m in model.modules() if isinstance(m, LlamaMLP)}

    def init(module):  # every module's own initialization, but the MLP's up projection's as ``replace`` says
        if isinstance(module, LlamaMLP):
            replace(module)
        if id(module) not in ups:
            own(module)

    monkeypatch.setattr(model, "_init_weights", init)
    return model, units, tensors


def test_a_parameter_its_parent_sets_is_refused_in_parts_naming_the_parent(monkeypatch):
    model, units, tensors = _llama_with_init(
        monkeypatch, lambda mlp: torch.nn.init.normal_(mlp.up_proj.weight, std=0.02))
    whole = dict(random_init(model, units, tensors, seed=5))  # whole units: the parent's call sets it
    assert torch.isfinite(whole["model.layers.0.mlp.up_proj.weight"]).all()
    monkeypatch.setattr(model_module, "WHOLE_UNIT_INIT_BYTES", 0)
    with pytest.raises(ValueError, match="LlamaMLP in unit model.layers.0 sets its submodules' parameters"):
        dict(random_init(model, units, tensors, seed=5))


def test_a_parameter_nothing_sets_is_refused_in_parts_by_name(monkeypatch):
    model, units, tensors = _llama_with_init(monkeypatch, lambda mlp: None)
    monkeypatch.setattr(model_module, "WHOLE_UNIT_INIT_BYTES", 0)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight is not set by its own module"):
        dict(random_init(model, units, tensors, seed=5))


def _nf4_roundtrip(w: torch.Tensor) -> torch.Tensor:
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    return F.dequantize_4bit(packed, state)


def test_lora_from_config_trains_on_the_plain_models_random_base_as_peft_does(trainer_config):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    cfg = tiny_config("llama")
    data = batches(3)
    with Trainer.from_config(cfg, trainer_config(seed=3)) as plain:
        init = plain.state_dict()
    spec = LoraSpec(r=4, alpha=8, base_format="nf4")
    with Trainer.from_config(cfg, trainer_config(seed=3, lora=spec, **BUDGETS)) as t:
        quantized = {n for n, i in t.tensors.items() if i.nf4}
        assert len(quantized) == 28  # q, k, v, o, gate, up, down of four layers
        base = {}
        for name, value in init.items():
            peft_name = t.lora.peft_name(name)
            base[name] = _nf4_roundtrip(value) if peft_name in quantized else value
            assert torch.equal(t.parameter(peft_name), base[name]), name
        adapters = {n: t.parameter(n) for n in t.tensors if t.lora.is_adapter(n)}
        assert all(v.abs().sum() == 0 for n, v in adapters.items() if "lora_B" in n)  # peft's B: zeros
        assert all(v.std() > 0 for n, v in adapters.items() if "lora_A" in n)

        ref_model = AutoModelForCausalLM.from_config(cfg)
        ref_model.load_state_dict(base, strict=False)
        ref = get_peft_model(ref_model, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM"))
        with torch.no_grad():
            for n, p in ref.named_parameters():
                if n in adapters:
                    p.copy_(adapters[n])
        ref.train()
        ref_losses, _ = reference_train(ref, data)
        losses = offloaded_train(t, data)
        assert max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)) <= RTOL
        for n, p in ref.named_parameters():
            if p.requires_grad:
                got = t.parameter(n)
                assert ((got - p.detach()).abs().max() / p.detach().abs().max()).item() <= RTOL, n
        assert any(t.parameter(n).abs().sum() > 0 for n in adapters if "lora_B" in n)  # the adapters trained
