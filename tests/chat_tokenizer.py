"""The word-level chat tokenizer the tests share: a vocabulary of 18 words (the special tokens first) and a chat
template, built locally (nothing downloads) and saved with save_pretrained."""
from __future__ import annotations

WORDS = ["<s>", "</s>", "<pad>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "hi", "there",
         "how", "are", "you", "fine", "be", "brief", "tell", "me"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def save_chat_tokenizer(path) -> str:
    """Save the tokenizer into the directory ``path``; returns it as a string."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(path))
    return str(path)
