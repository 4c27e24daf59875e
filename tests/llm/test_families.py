"""Every supported model family trains equal to plain PyTorch AdamW (fp32), state on the SSD.

Tiny random configs (hidden 32, 2 layers, vocab 96, 64 positions), saved with ``save_pretrained`` and loaded by
``Trainer.from_pretrained``: the checkpoint keys go through transformers' own conversions (GPT-NeoX's
``embed_out``, the per-expert tensors of Mixtral and Qwen3-MoE). Dropout is off, so the reference and the
offloaded run draw nothing. Two steps each, with gradient clipping (and without, for some).
"""
import pytest
import torch

from terastack.llm import Trainer

from .llm_helpers import VOCAB, batches, max_weight_diff, offloaded_train, reference_train

TOL = 1e-5
STEPS = 2

_ATTN = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=2)


def family_config(family: str):
    """A tiny random config of ``family`` (a transformers model_type), dropout off."""
    import transformers as tf

    if family == "llama":
        cfg = tf.LlamaConfig(**_ATTN)
    elif family == "mistral":
        cfg = tf.MistralConfig(**_ATTN, sliding_window=8)
    elif family == "mixtral":  # 4 experts, 2 per token
        cfg = tf.MixtralConfig(**_ATTN, num_local_experts=4, num_experts_per_tok=2)
    elif family == "qwen2":
        cfg = tf.Qwen2Config(**_ATTN)
    elif family == "qwen3":
        cfg = tf.Qwen3Config(**_ATTN, head_dim=8)
    elif family == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**_ATTN, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                decoder_sparse_step=1, mlp_only_layers=[])
    elif family == "gemma":  # tied embeddings
        cfg = tf.GemmaConfig(**_ATTN, head_dim=8)
    elif family == "gemma2":  # soft-capped logits, sliding and global layers
        cfg = tf.Gemma2Config(**_ATTN, head_dim=8, sliding_window=8)
    elif family == "gemma3_text":
        cfg = tf.Gemma3TextConfig(**_ATTN, head_dim=8, sliding_window=8)
    elif family == "llama4_text":  # MoE with a shared expert, a layer without RoPE (temperature-tuned), chunked
        cfg = tf.Llama4TextConfig(**_ATTN, head_dim=8, intermediate_size_mlp=64, num_local_experts=4,
                                  num_experts_per_tok=1, moe_layers=[0, 1], no_rope_layers=[1, 0],
                                  attention_chunk_size=8, floor_scale=4, attn_scale=0.1)
    elif family == "phi3":
        cfg = tf.Phi3Config(**_ATTN)
    elif family == "olmo2":
        cfg = tf.Olmo2Config(**_ATTN)
    elif family == "starcoder2":
        cfg = tf.Starcoder2Config(**_ATTN, sliding_window=8)
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                            eos_token_id=1)
    elif family == "gpt_neox":
        cfg = tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=64, bos_token_id=0, eos_token_id=1)
    elif family == "gptj":
        cfg = tf.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
                            bos_token_id=0, eos_token_id=1)
    elif family == "opt":
        cfg = tf.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                           word_embed_proj_dim=32, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                           eos_token_id=1, pad_token_id=2)
    elif family == "falcon":
        cfg = tf.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=64, bos_token_id=0, eos_token_id=1)
    else:
        raise ValueError(family)
    for name, value in list(cfg.to_dict().items()):
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(cfg, name, 0.0)
    return cfg


def save_family(family: str, path, seed: int = 0):
    """A randomly initialized tiny ``family`` model saved with save_pretrained; returns the in-memory reference."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family))
    model.save_pretrained(str(path))
    model.train()
    return model


FAMILIES = ["llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "phi3",
            "gpt2", "gpt_neox", "gptj", "opt", "falcon", "olmo2", "starcoder2", "llama4_text"]


#: clipping on for every family; off (the eager schedule) for a few with something of their own, to stay fast
CASES = ([pytest.param(f, 0.5, id=f"{f}-clip") for f in FAMILIES]
         + [pytest.param(f, None, id=f"{f}-noclip") for f in ("mixtral", "qwen3_moe", "gemma2", "gpt_neox", "gptj",
                                                               "falcon", "llama4_text")])


@pytest.mark.parametrize("family,clip", CASES)
def test_family_trains_like_plain_adamw(family, clip, tmp_path, trainer_config):
    ref = save_family(family, tmp_path / "model")
    data = batches(STEPS)
    cfg = trainer_config(max_grad_norm=clip, state_placement="ssd")
    with Trainer.from_pretrained(tmp_path / "model", cfg) as trainer:
        losses = offloaded_train(trainer, data)
        ref_losses, _ = reference_train(ref, data, max_grad_norm=clip)
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        assert max_weight_diff(trainer, ref) <= TOL
        assert trainer.history[-1].ssd_read_bytes > 0  # the state really travelled through the SSD


def test_verified_families_are_the_tested_ones():
    """The engine skips its check before training ([Note: the family check] in terastack.llm.engine.family_check)
    for exactly the families this file proves."""
    from terastack.llm.model import TESTED_FAMILIES

    assert sorted(TESTED_FAMILIES) == sorted(FAMILIES)
    for family in FAMILIES:
        assert family_config(family).model_type == family
