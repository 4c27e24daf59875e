"""Models known by name: the built-in default (trains with no download) and well-known architectures.

Names map to Hugging Face configs built locally (``transformers.AutoConfig.for_model``), never fetched:
the small ones are trained from a random initialization, the large ones exist for ``terastack plan llm``.
"""
from __future__ import annotations

from terastack.training.data.stdlib_corpus import BYTE_VOCAB

DEFAULT_MODEL = "tiny-llama"

_LLAMA = {"model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False}

MODELS: dict[str, dict] = {
    # the default of `terastack finetune`: about 4.9M parameters over the byte vocabulary
    "tiny-llama": {**_LLAMA, "vocab_size": BYTE_VOCAB, "hidden_size": 256, "intermediate_size": 688,
                   "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4,
                   "max_position_embeddings": 1024, "bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258},
    # the model of `terastack bench llm`: 154M parameters. Its proportions follow the models the engine is for
    # (in Llama-2-7B a decoder layer holds 202M parameters, the embedding 131M): a decoder layer (7.1M) is
    # larger than the embedding (6.1M); with a 32K vocabulary a model this small would be a quarter embedding.
    "llama-150m": {**_LLAMA, "vocab_size": 8000, "hidden_size": 768, "intermediate_size": 2048,
                   "num_hidden_layers": 20, "num_attention_heads": 12, "num_key_value_heads": 12,
                   "max_position_embeddings": 2048},
    # the ladder of `terastack bench llm-scale`: 0.55B, 1.1B (TinyLlama's shape) and 3.4B (OpenLLaMA-3B's shape)
    "llama-550m": {**_LLAMA, "vocab_size": 32000, "hidden_size": 1536, "intermediate_size": 4096,
                   "num_hidden_layers": 16, "num_attention_heads": 24, "num_key_value_heads": 24,
                   "max_position_embeddings": 2048},
    "llama-1.1b": {**_LLAMA, "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
                   "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
                   "max_position_embeddings": 2048},
    "openllama-3b": {**_LLAMA, "vocab_size": 32000, "hidden_size": 3200, "intermediate_size": 8640,
                     "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 32,
                     "max_position_embeddings": 2048},
    "llama-2-7b": {**_LLAMA, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "max_position_embeddings": 4096},
    "llama-2-13b": {**_LLAMA, "vocab_size": 32000, "hidden_size": 5120, "intermediate_size": 13824,
                    "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
                    "max_position_embeddings": 4096},
    "llama-2-70b": {**_LLAMA, "vocab_size": 32000, "hidden_size": 8192, "intermediate_size": 28672,
                    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                    "max_position_embeddings": 4096},
    # the shapes people fine-tune most: Llama 3 8B (full fine-tunes) and 70B (LoRA), with their 128K vocabulary
    "llama-3-8b": {**_LLAMA, "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "max_position_embeddings": 8192, "rope_theta": 500000.0},
    "llama-3-70b": {**_LLAMA, "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
                    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                    "max_position_embeddings": 8192, "rope_theta": 500000.0},
    "qwen2-7b": {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                 "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                 "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "gpt2": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
             "n_positions": 1024},
    "gpt2-xl": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 1600, "n_layer": 48, "n_head": 25,
                "n_positions": 1024},
}


def _opt(hidden: int, layers: int, heads: int) -> dict:
    return {"model_type": "opt", "vocab_size": 50272, "hidden_size": hidden, "ffn_dim": 4 * hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "word_embed_proj_dim": hidden,
            "max_position_embeddings": 2048, "do_layer_norm_before": True, "enable_bias": True}


MODELS.update({"opt-125m": _opt(768, 12, 12), "opt-1.3b": _opt(2048, 24, 32), "opt-6.7b": _opt(4096, 32, 32),
               "opt-13b": _opt(5120, 40, 40), "opt-30b": _opt(7168, 48, 56), "opt-66b": _opt(9216, 64, 72),
               "opt-175b": _opt(12288, 96, 96)})


def hf_config(name: str):
    """The ``transformers`` config of built-in model ``name``."""
    from transformers import AutoConfig

    try:
        fields = dict(MODELS[name])
    except KeyError:
        raise ValueError(f"unknown model {name!r}: give a Hugging Face model directory, a config.json, or one of "
                         f"{', '.join(sorted(MODELS))}") from None
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)


def resolve_model(spec: str):
    """(hf_config, model_dir or None) for a model directory, a config.json path, a built-in name, or a Hugging Face
    Hub id ``ORG/NAME[@revision]`` (downloaded, or read from the local cache offline)."""
    import os

    from terastack.training.hf.model_files import load_hf_config

    if os.path.isdir(spec):
        has_weights = any(os.path.exists(os.path.join(spec, f)) for f in
                          ("model.safetensors", "model.safetensors.index.json"))
        return load_hf_config(spec), (spec if has_weights else None)
    if spec.endswith(".json"):
        if not os.path.exists(spec):
            raise FileNotFoundError(f"model config {spec} does not exist")
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(spec), None
        except (ValueError, OSError) as exc:
            raise ValueError(f"{spec} is not a usable model config ({exc})") from None
    if spec in MODELS:
        return hf_config(spec), None
    from terastack.training.hf import hub

    if hub.is_hub_id(spec, sep="@"):  # ORG/NAME[@revision]: the Hub, or its local cache ([Note: Hub ids])
        return resolve_model(str(hub.model_dir(spec)))
    if os.sep in spec or spec.startswith("."):
        raise FileNotFoundError(f"model directory {spec} does not exist")
    return hf_config(spec), None


def config_json_of(spec: str) -> str | None:
    """The config.json a model spec names: DIR/config.json for a model directory, the spec itself where it is a
    .json path; None for anything else (a built-in name, a Hub id)."""
    import os

    return os.path.join(spec, "config.json") if os.path.isdir(spec) else spec if spec.endswith(".json") else None


def model_type_of(spec: str) -> str | None:
    """The ``model_type`` of a built-in name, a model directory or a config.json, read without importing
    transformers; None where that needs more (a Hub id, a file that cannot be read): the caller then goes without."""
    import json

    if spec in MODELS:
        return MODELS[spec]["model_type"]
    path = config_json_of(spec)
    if path is None:
        return None
    try:
        with open(path) as f:
            return json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
