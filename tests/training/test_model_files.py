"""Positions past the model's limit: refused where the model has no row for them, a warning and RoPE scaling
where it computes rotary angles on the fly; a scaled model runs the longer sequence and its saved config carries
the scaling."""
import pytest
import torch

from terastack.training.hf.model_files import apply_rope_scaling, check_seq_len


def _llama(max_pos=32):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos)


def test_learned_positions_are_refused_rotary_ones_warned():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="no positions beyond"):
        check_seq_len(GPT2Config(n_positions=32), 64)
    assert check_seq_len(_llama(), 32) is None
    note = check_seq_len(_llama(), 80)
    assert "never trained" in note and "--rope-scaling" in note and " 3" in note


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn"])
def test_rope_scaling_extends_the_context_and_is_saved(kind, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = _llama()
    apply_rope_scaling(config, kind, 2)
    assert config.max_position_embeddings == 64 and check_seq_len(config, 64) is None
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, 64, (1, 64))
    assert torch.isfinite(model(input_ids=ids).logits).all()
    if kind != "dynamic":  # linear/yarn change the angles at every position: the scaled model is another function
        plain = AutoModelForCausalLM.from_config(_llama(64))
        plain.load_state_dict(model.state_dict())
        assert not torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits)
    config.save_pretrained(str(tmp_path))
    back = AutoConfig.from_pretrained(str(tmp_path))
    assert back.rope_parameters["rope_type"] == kind and back.rope_parameters["factor"] == 2.0
    with pytest.raises(ValueError, match="factor"):
        apply_rope_scaling(_llama(), kind, 1)
