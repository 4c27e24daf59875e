"""Shared helpers: tiny Hugging Face models saved to a temp dir, and the plain PyTorch reference training."""
import weakref

import torch

VOCAB = 96
SEQ = 16
BATCH = 2


def tiny_config(family: str, layers: int = 4):
    from transformers import GPT2Config, LlamaConfig, OPTConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=1)
    if family == "llama":
        return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, **common)
    if family == "qwen2":
        return Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, **common)
    if family == "gpt2":  # tied embeddings, dropout 0.1 everywhere (the GPT-2 default)
        return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=64, bos_token_id=0,
                          eos_token_id=1)
    if family == "opt":  # tied embeddings, learned positions, dropout 0.1
        return OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=layers, num_attention_heads=4,
                         word_embed_proj_dim=32, pad_token_id=2, **common)
    raise ValueError(family)


def make_model(family: str, path, *, seed: int = 0, layers: int = 4):
    """A randomly initialized tiny model saved with save_pretrained; returns the in-memory reference."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, layers))
    model.save_pretrained(str(path))
    model.train()
    return model


def batches(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def reference_train(model, data, *, lr=1e-3, weight_decay=0.01, max_grad_norm=None, fused=None, seed=5, opt=None):
    """Plain in-memory PyTorch AdamW training (``opt``: another reference optimizer over the model's parameters);
    the RNG stream (dropout) starts from ``seed`` as in ours."""
    if opt is None:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=fused)
    losses = []
    torch.manual_seed(seed)
    for ids in data:
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return losses, opt


def offloaded_train(trainer, data, *, seed=5):
    torch.manual_seed(seed)
    return [trainer.step(ids) for ids in data]


def max_weight_diff(trainer, model) -> float:
    return max((trainer.parameter(n) - p.detach()).abs().max().item() for n, p in model.named_parameters())


class AliveTensors:
    """Counts tensors handed out (``track(t)``) and the most of them alive at once: a streaming writer holds one
    group at a time, a writer that gathers the model holds them all."""

    def __init__(self):
        self._alive: set = set()
        self.calls = 0
        self.peak = 0

    def track(self, t):
        token = object()
        self._alive.add(token)
        weakref.finalize(t, self._alive.discard, token)
        self.calls += 1
        self.peak = max(self.peak, len(self._alive))
        return t
