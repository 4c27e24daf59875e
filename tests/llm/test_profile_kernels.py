"""The planner's profile runs units on meta tensors; its saved bytes and FLOPs must be those of the kernels a real
CPU step takes ([Note: the profile's kernels are training's kernels]). The reference is the real model: the bytes
autograd saves inside one decoder layer during a real forward, and torch's FLOP counter over that forward."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from terastack.llm.engine.meta_kernels import register_flop_formulas
from terastack.llm.engine.profile import profile_config

from .llm_helpers import VOCAB, tiny_config

BATCH, SEQ = 2, 48


def _first_layer(model):
    return next(m for name, m in model.named_modules() if name.endswith(("layers.0", "h.0")))


def _real_layer(model, ids):
    """Bytes saved for backward inside the first decoder layer (parameters excluded, views counted once by their
    base, as the profile counts them) and the layer's forward FLOPs, from one real forward."""
    layer, params = _first_layer(model), {id(p) for p in model.parameters()}
    inside, saved = [False], {}

    def pack(t):
        base = t._base if t._base is not None else t
        if inside[0] and id(t) not in params and id(base) not in params:
            saved.setdefault(id(base), (base, base.numel() * base.element_size()))
        return t

    flops = {}
    counter = FlopCounterMode(display=False)

    def enter(*_):
        inside[0] = True
        counter.__enter__()

    def leave(*_):
        counter.__exit__(None, None, None)
        inside[0] = False
        flops["fwd"] = counter.get_total_flops()

    hooks = [layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return sum(n for _, n in saved.values()), flops["fwd"]


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_profiled_layer_saves_and_computes_what_a_real_layer_does(family, dtype):
    from transformers import AutoModelForCausalLM

    register_flop_formulas()
    cfg = tiny_config(family, layers=2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    real_bytes, real_flops = _real_layer(model, ids)
    profile = profile_config(cfg, batch=BATCH, seq_len=SEQ, dtype=dtype, name=family)
    layer = next(u for u in profile.units if u.kind == "layer")
    # torch's meta layer norm keeps its mean and rstd in fp32, as a GPU's does; the CPU's bf16 kernel keeps them
    # in bf16: 2 bytes a token less for each of the two statistics of the layer's two norms (GPT-2, OPT)
    slack = 2 * 2 * 2 * BATCH * SEQ if dtype == torch.bfloat16 and family != "llama" else 0
    assert real_bytes <= layer.act_bytes <= real_bytes + slack
    assert layer.fwd_flops == real_flops


def test_meta_attention_takes_the_flash_kernel_and_saves_no_probabilities():
    """Without the routing, meta attention takes the math path and saves heads x tokens x tokens probabilities:
    the figure the planner once over-priced activations by."""
    from terastack.llm.engine.meta_kernels import MetaKernels

    q = torch.empty(1, 8, 256, 16, device="meta", requires_grad=True)
    kv = torch.empty(1, 2, 256, 16, device="meta", requires_grad=True)
    sizes = {}
    for routed in (False, True):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
            if routed:
                with MetaKernels():
                    torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
            else:
                torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        sizes[routed] = max(t.numel() for t in saved)
    assert sizes[False] >= 8 * 256 * 256  # the math path's probabilities
    assert sizes[True] == 8 * 256 * 16  # the flash kernel's largest saved tensor: the query (or output)
