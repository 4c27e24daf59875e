"""A TRL SFTTrainer script with and without ``offload``: plain text (two families), prompt/completion
(completion-only loss), conversational data (assistant-only loss) and packing end with the same saved weights and
the same logs, TRL's own figures included (entropy, mean_token_accuracy, num_tokens); trainers with another loss
are refused by name."""
import pytest

from ..chat_tokenizer import WORDS
from .hf_helpers import ARGS, assert_same_run, dataset, log_callback, offload, saved_weights, tiny_model

trl = pytest.importorskip("trl")

def run(tmp_path, tokenizer, *, kind, family="llama", dropout=0.0, hardware=None, name="run", **config):
    from trl import SFTConfig, SFTTrainer

    logs = []
    args = SFTConfig(output_dir=str(tmp_path / name), bf16=False, max_length=32, **{**ARGS, **config})
    trainer = SFTTrainer(model=tiny_model(family, vocab=len(WORDS), dropout=dropout), args=args,
                         train_dataset=dataset(kind), processing_class=tokenizer, callbacks=[log_callback(logs)])
    if hardware is not None:
        offload(trainer, tmp_path / name, hardware)
    trainer.train()
    return saved_weights(trainer, tmp_path / name / "saved"), logs, trainer


@pytest.mark.parametrize("kind, family, dropout, config", [
    ("text", "llama", 0.1, {}), ("text", "qwen2", 0.0, {}),
    ("prompt_completion", "llama", 0.0, {}), ("conversational", "llama", 0.0, {"assistant_only_loss": True}),
    ("text", "llama", 0.0, {"packing": True})],
    ids=["text-llama-dropout", "text-qwen2", "prompt-completion", "conversational", "packing"])
def test_offloaded_sft_equals_the_plain_one(kind, family, dropout, config, tmp_path, tokenizer, hardware_file):
    plain = run(tmp_path, tokenizer, kind=kind, family=family, dropout=dropout, name="plain", **config)
    weights, logs, trainer = run(tmp_path, tokenizer, kind=kind, family=family, dropout=dropout,
                                 hardware=hardware_file, name="offloaded", **config)
    assert_same_run(plain[:2], (weights, logs))
    steps = [line for line in logs if "loss" in line]
    assert len(steps) == 4 and all({"entropy", "mean_token_accuracy", "num_tokens", "tokens_per_s",
                                    "ssd_read_bytes_per_step"} <= set(line) for line in steps)
    if kind == "prompt_completion":  # the prompt is outside the loss
        data = trainer.train_dataset[0]
        assert -100 in data["labels"] and data["labels"] != data["input_ids"]
    if config.get("packing"):  # TRL's padding-free rows: the engine planned one packed row of the batch
        assert trainer.terastack.engine.config.packed and trainer.terastack.engine.config.batch_size == 1
    trainer.terastack.close()


def test_evaluation_logs_trl_figures(tmp_path, tokenizer, hardware_file):
    from trl import SFTConfig, SFTTrainer

    def evaluated(hardware):
        args = SFTConfig(output_dir=str(tmp_path / ("plain" if hardware is None else "offloaded")), bf16=False, max_length=32, report_to=[],
                         use_cpu=True, per_device_eval_batch_size=4)
        trainer = SFTTrainer(model=tiny_model("llama", vocab=len(WORDS), dropout=0.0), args=args,
                             train_dataset=dataset("text"), eval_dataset=dataset("conversational", 8),
                             processing_class=tokenizer)
        if hardware is not None:
            offload(trainer, tmp_path / "offloaded", hardware)
        return trainer.evaluate()

    plain, offloaded = evaluated(None), evaluated(hardware_file)
    for key in ("eval_loss", "eval_entropy", "eval_mean_token_accuracy"):
        assert offloaded[key] == pytest.approx(plain[key], rel=1e-5), key


@pytest.mark.parametrize("name", ["DPOTrainer", "GRPOTrainer"])
def test_trainers_with_another_loss_are_refused(name, tmp_path, hardware_file):
    cls = getattr(trl, name)
    trainer = cls.__new__(cls)  # the check reads the class: nothing of the trainer is built
    with pytest.raises(ValueError, match=f"{name} overrides compute_loss .*served: transformers.Trainer and TRL's"):
        offload(trainer, tmp_path, hardware_file)


def test_sft_loss_type_dft_is_refused(tmp_path, tokenizer, hardware_file):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "o"), bf16=False, report_to=[], use_cpu=True, loss_type="dft")
    trainer = SFTTrainer(model=tiny_model("llama", vocab=len(WORDS)), args=args, train_dataset=dataset("text"),
                         processing_class=tokenizer)
    with pytest.raises(ValueError, match="loss_type='dft'; served: 'nll'"):
        offload(trainer, tmp_path, hardware_file)
