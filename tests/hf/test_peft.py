"""LoRA from a Trainer: SFTTrainer's peft_config trains the engine's LoRA equal to peft's; over an empty model with
the base as NF4 (the QLoRA script) equal to peft over bitsandbytes' dequantized NF4 base; what the engine's LoRA
does not equal is refused."""
import pytest
import torch

from ..chat_tokenizer import WORDS
from .hf_helpers import (ARGS, assert_same_run, dataset, log_callback, offload, pad_collate, saved_weights, tiny_model,
                         token_rows)

peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")


def lora_config(**kw):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM",
                      **kw)


def sft(tmp_path, tokenizer, model, *, name, hardware=None, adapters=None, **settings):
    from trl import SFTConfig, SFTTrainer

    logs = []
    args = SFTConfig(output_dir=str(tmp_path / name), bf16=False, max_length=32, **ARGS)
    torch.manual_seed(7)  # peft draws the adapters' initial values when the SFTTrainer wraps the model
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset("prompt_completion"), processing_class=tokenizer,
                         peft_config=lora_config(), callbacks=[log_callback(logs)])
    if adapters is not None:  # the initial adapters of another run
        with torch.no_grad():
            for n, p in trainer.model.named_parameters():
                if n in adapters:
                    p.copy_(adapters[n])
    if hardware is not None:
        offload(trainer, tmp_path / name, hardware, **settings)
    return trainer, logs


def test_sft_peft_config_equals_peft(tmp_path, tokenizer, hardware_file):
    model = tiny_model("llama", vocab=len(WORDS), dropout=0.0)
    plain, plain_logs = sft(tmp_path, tokenizer, model, name="plain")
    plain.train()
    expected = saved_weights(plain, tmp_path / "plain_saved")
    offloaded, logs = sft(tmp_path, tokenizer, tiny_model("llama", vocab=len(WORDS), dropout=0.0), name="offloaded",
                          hardware=hardware_file)
    engine = offloaded.terastack.engine
    assert engine.lora is not None
    assert {n for n, t in engine.tensors.items() if t.trainable} == {n for n in engine.tensors if ".lora_" in n}
    offloaded.train()
    got = saved_weights(offloaded, tmp_path / "offloaded_saved")  # a peft adapter directory
    assert (tmp_path / "offloaded_saved" / "adapter_config.json").exists()
    assert_same_run((expected, plain_logs), (got, logs))
    offloaded.terastack.close()


def _nf4_rounded(model) -> None:
    """``model``'s decoder projections NF4-quantized and dequantized by bitsandbytes (QLoRA's base)."""
    F = pytest.importorskip("bitsandbytes.functional")
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and ".layers." in name:
                packed, state = F.quantize_4bit(m.weight.data, blocksize=64, quant_type="nf4")
                m.weight.copy_(F.dequantize_4bit(packed, state))


def test_qlora_over_an_empty_model(tmp_path, tokenizer, hardware_file):
    """empty_model(path, quantization_config=NF4) + peft_config: no weight in memory before offload, the base streamed as
    NF4, the adapters trained equal to peft's over the dequantized NF4 base (starting from the same adapters)."""
    from transformers import BitsAndBytesConfig

    import terastack.hf

    tiny_model("llama", vocab=len(WORDS), dropout=0.0).save_pretrained(str(tmp_path / "base"))
    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")  # what a QLoRA script passes
    empty = terastack.hf.empty_model(str(tmp_path / "base"), quantization_config=nf4, dtype=torch.float32)
    assert all(p.device.type == "meta" for p in empty.parameters())
    offloaded, logs = sft(tmp_path, tokenizer, empty, name="offloaded", hardware=hardware_file)
    engine = offloaded.terastack.engine
    assert engine.lora.base_format == "nf4" and any(t.nf4 for t in engine.tensors.values())
    start = {n: engine.parameter(n) for n in engine.tensors if ".lora_" in n}
    offloaded.train()
    got = saved_weights(offloaded, tmp_path / "offloaded_saved")
    offloaded.terastack.close()

    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"))
    _nf4_rounded(base)
    plain, plain_logs = sft(tmp_path, tokenizer, base, name="plain", adapters=start)
    plain.train()
    assert_same_run((saved_weights(plain, tmp_path / "plain_saved"), plain_logs), (got, logs))


@pytest.mark.parametrize("kw, match", [({"use_dora": True}, "DoRA"),
                                       ({"modules_to_save": ["lm_head"]}, r"modules_to_save=\['lm_head'\]"),
                                       ({"bias": "lora_only"}, "bias='lora_only'")])
def test_what_the_engines_lora_does_not_equal(kw, match, tmp_path, hardware_file):
    from peft import get_peft_model
    from transformers import Trainer, TrainingArguments

    model = get_peft_model(tiny_model("llama"), lora_config(**kw))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, max_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=token_rows(4), data_collator=pad_collate)
    with pytest.raises(ValueError, match=f"the peft model has {match}; served: one LoRA adapter"):
        offload(trainer, tmp_path, hardware_file)
