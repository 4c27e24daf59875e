"""A TRL SFTTrainer script whose model trains through terastack's offloaded engine: the one added line is
``terastack.hf.offload(...)``.

    python examples/sft_offload.py                         # a tiny random Llama and chat data made here (no download)
    python examples/sft_offload.py --model /models/llama-3.2-1b --store /nvme/run --memory-budget 8GiB

With ``--model`` the checkpoint's tokenizer and chat template are used; the model is built with
``terastack.hf.empty_model`` (no weights in memory) and its weights go from the checkpoint files to the store.
See docs/hf.md.
"""
from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

WORDS = ["<s>", "</s>", "<pad>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>", "hi", "there", "how", "are",
         "you", "fine", "thanks", "what", "time", "is", "it", "late", "early"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|> {% generation %}"
            "{{ m['content'] }} <|end|> {% endgeneration %}{% else %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")


def tiny_model_dir(path: Path) -> Path:
    """A random tiny Llama and a word-level chat tokenizer, saved with save_pretrained into ``path``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", additional_special_tokens=["<|user|>", "<|assistant|>", "<|end|>"])
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(path))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0,
                         eos_token_id=1, pad_token_id=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    return path


def conversations(n: int, seed: int = 0):
    from datasets import Dataset

    rnd = random.Random(seed)

    def say(k: int) -> str:
        return " ".join(rnd.choice(WORDS[7:]) for _ in range(k))

    return Dataset.from_list([{"messages": [{"role": "user", "content": say(rnd.randint(2, 6))},
                                            {"role": "assistant", "content": say(rnd.randint(2, 8))}]}
                              for _ in range(n)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a Hugging Face model directory (default: a tiny random Llama made here)")
    p.add_argument("--store", help="a directory on an SSD for the training state (default: a temporary one)")
    p.add_argument("--memory-budget", default="64MiB", help="host memory for the engine (default 64MiB)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--output", help="where the Trainer writes (default: a temporary directory)")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    import terastack.hf

    work = Path(tempfile.mkdtemp(prefix="sft-offload-"))
    model_dir = Path(args.model) if args.model else tiny_model_dir(work / "model")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.chat_template is None or "generation" not in tokenizer.chat_template:
        tokenizer.chat_template = TEMPLATE
    config = SFTConfig(output_dir=args.output or str(work / "out"), max_steps=args.steps,
                       per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=2e-4,
                       lr_scheduler_type="cosine", warmup_steps=0.1, max_grad_norm=1.0, logging_steps=1,
                       save_steps=args.steps // 2, eval_strategy="steps", eval_steps=args.steps // 2,
                       assistant_only_loss=True, max_length=128, bf16=False, report_to=[], use_cpu=True)
    trainer = SFTTrainer(model=terastack.hf.empty_model(str(model_dir)), args=config,
                         train_dataset=conversations(64), eval_dataset=conversations(8, seed=1),
                         processing_class=tokenizer)
    terastack.hf.offload(trainer, store=args.store or str(work), memory_budget=args.memory_budget)
    trainer.train()
    print("eval:", trainer.evaluate())
    trainer.save_model()
    print(f"saved to {config.output_dir} (loads with AutoModelForCausalLM.from_pretrained)")
    trainer.terastack.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
