"""Checkpoint keys go through transformers' own conversions (terastack.training.hf.keys), and families or shapes that
cannot train are refused before anything runs.

- GPT-NeoX (Pythia) stores its head as ``embed_out.weight``; transformers renames it to ``lm_head.weight`` on load
  and back on save.
- Mixtral stores one tensor per expert (``experts.N.w1.weight``); transformers 5 stacks them into
  ``experts.gate_up_proj`` on load and splits them again on save.
"""
import pytest
import torch
from safetensors import safe_open

from terastack.llm import Trainer
from terastack.llm.model import find_units
from terastack.training.hf.model_files import build_skeleton

from .llm_helpers import batches, max_weight_diff, offloaded_train, reference_train
from .test_families import family_config, save_family


def _keys(path) -> list[str]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return sorted(f.keys())


@pytest.mark.parametrize("family", ["gpt_neox", "mixtral", "qwen3_moe"])
def test_load_train_export_round_trip(family, tmp_path, trainer_config):
    from transformers import AutoModelForCausalLM

    ref = save_family(family, tmp_path / "model")
    if family == "gpt_neox":
        assert "embed_out.weight" in _keys(tmp_path / "model")  # not the module's name: renamed on load
    else:
        assert any(".experts.0." in k for k in _keys(tmp_path / "model"))  # per expert, stacked on load
    data = batches(3)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(max_grad_norm=1.0)) as trainer:
        losses = offloaded_train(trainer, data)
        ref_losses, _ = reference_train(ref, data, max_grad_norm=1.0)
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        assert max_weight_diff(trainer, ref) <= 1e-5
        trainer.save_pretrained(tmp_path / "out")
        trained = trainer.state_dict()
    # the exported file holds exactly the keys transformers' save_pretrained writes for this family ...
    ref.save_pretrained(str(tmp_path / "ref_out"))
    assert _keys(tmp_path / "out") == _keys(tmp_path / "ref_out")
    # ... and transformers loads it back equal to the trained weights
    loaded = dict(AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).named_parameters())
    assert sorted(loaded) == sorted(trained)
    for name, p in loaded.items():
        assert torch.equal(p.detach(), trained[name]), name


@pytest.mark.parametrize("family", ["gpt2", "gptj", "opt"])
def test_seq_len_beyond_positions_is_refused(family, tmp_path, trainer_config):
    save_family(family, tmp_path / "model")
    with pytest.raises(ValueError, match=f"seq_len 256 > max_position_embeddings 64 of {family}"):
        Trainer.from_pretrained(tmp_path / "model", trainer_config(seq_len=256))


def test_mixture_of_experts_profiles_on_meta(tmp_path):
    """The planner's profile runs every unit on meta tensors; torch's meta kernel of grouped_mm takes bf16 only,
    and the experts' FLOPs are counted (2 of 4 experts per token, three matrices of hidden x intermediate)."""
    from terastack.llm.engine.profile import profile_config

    cfg = family_config("mixtral")
    prof = profile_config(cfg, batch=2, seq_len=16, dtype=torch.float32, name="tiny mixtral")
    layer = next(u for u in prof.units if u.kind == "layer")
    expert_flops = 2 * (2 * 16) * 2 * 3 * cfg.hidden_size * cfg.intermediate_size
    assert layer.fwd_flops >= expert_flops
    assert layer.bwd_flops >= 2 * expert_flops


def test_hybrid_stack_refused_naming_the_family():
    from transformers import JambaConfig

    cfg = JambaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                      expert_layer_offset=1, num_experts=2, mamba_d_state=4, mamba_dt_rank=4)
    with pytest.raises(ValueError, match=r"jamba \(JambaForCausalLM\).*mixes layer kinds"):
        find_units(build_skeleton(cfg))
