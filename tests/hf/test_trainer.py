"""A transformers Trainer script with and without ``terastack.hf.offload``: the same saved weights and logged figures
(fp32, 1e-5), with gradient accumulation, clipping, a cosine schedule with warmup, weight decay and non-default
Adam settings; and each of those arguments matters to the comparison (a run that dropped one would fail it)."""
import pytest
import torch

from terastack.tiers import Tier

from .hf_helpers import ARGS, assert_same_run, log_callback, offload, pad_collate, saved_weights, tiny_model, token_rows


def run(tmp_path, family="llama", *, hardware=None, name="run", dropout=0.1, hidden=32, **changes):
    """The script: a Trainer over a tiny model; offloaded when ``hardware`` is given. (saved weights, logs, trainer)."""
    from transformers import Trainer, TrainingArguments

    logs = []
    args = TrainingArguments(output_dir=str(tmp_path / name), **{**ARGS, **changes})
    trainer = Trainer(model=tiny_model(family, dropout=dropout, hidden=hidden), args=args, train_dataset=token_rows(),
                      data_collator=pad_collate, callbacks=[log_callback(logs)])
    if hardware is not None:
        offload(trainer, tmp_path / name, hardware)
    trainer.train()
    return saved_weights(trainer, tmp_path / name / "saved"), logs, trainer


@pytest.mark.parametrize("family, dropout, changes", [
    ("llama", 0.1, {}), ("qwen2", 0.0, {"max_steps": -1, "num_train_epochs": 1, "gradient_checkpointing": True})],
    ids=["llama-dropout", "qwen2-epochs-checkpointing"])
def test_offloaded_trainer_equals_the_plain_one(family, dropout, changes, tmp_path, hardware_file):
    """With dropout the engine runs the micro-batches one by one (the Trainer's draws); without, stacked (its
    vertical order: each layer's weights read once a step)."""
    plain = run(tmp_path, family, name="plain", dropout=dropout, **changes)
    weights, logs, trainer = run(tmp_path, family, hardware=hardware_file, name="offloaded", dropout=dropout,
                                 **changes)
    assert_same_run(plain[:2], (weights, logs))
    engine = trainer.terastack.engine
    assert set(engine.plan.state_home.values()) == {Tier.SSD}  # the state rested on the SSD
    assert [h.ssd_read_bytes > 0 for h in engine.history] == [True] * 4
    # the Trainer's two groups: the decayed weights, then biases and norms (the engine exempts those)
    exempt = {n for n in engine.tensors if "norm" in n or n.endswith(".bias")}
    assert engine.optimizer.config.no_decay == exempt
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0] and len(groups[1]["params"]) == len(exempt)
    assert [line["learning_rate"] for line in logs[:4]] == [line["learning_rate"] for line in plain[1][:4]]
    assert engine.plan.accumulation == ("horizontal" if dropout else "vertical")
    if changes.get("gradient_checkpointing"):  # every decoder layer recomputed, by the engine
        layers = [p for u, p in zip(engine.profile.units, engine.plan.policies) if ".layers." in u.name]
        assert layers == ["recompute"] * 2
    trainer.terastack.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("reference")
    return run(path)[0]


#: each honoured argument at another value: the plain Trainer's run differs from the reference's by more than the
#: equality test's tolerance, so an integration that dropped it (the engine running the default) fails that test
CHANGED = {"learning_rate": 5e-3, "lr_scheduler_type": ("linear", {"lr_scheduler_kwargs": {}}),
           "lr_scheduler_kwargs": {}, "warmup_steps": 0,
           "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
           "max_grad_norm": 0.0, "gradient_accumulation_steps": 1, "per_device_train_batch_size": 4,
           "max_steps": 3, "num_train_epochs": (0.5, {"max_steps": -1}), "seed": 42, "data_seed": None}


@pytest.mark.parametrize("argument", sorted(CHANGED))
def test_every_honoured_argument_changes_the_result(argument, reference, tmp_path):
    value, more = CHANGED[argument] if isinstance(CHANGED[argument], tuple) else (CHANGED[argument], {})
    weights = run(tmp_path, **{argument: value, **more})[0]
    assert max((weights[k] - reference[k]).abs().max().item() for k in reference) > 1e-4


def test_adamw_bnb_8bit_equals_the_trainers_own(tmp_path, hardware_file):
    """optim="adamw_bnb_8bit": the engine's adamw8bit, with the embedding's state at 32 bits as the Trainer registers
    it with bitsandbytes, equals the Trainer's own bitsandbytes AdamW."""
    bnb = pytest.importorskip("bitsandbytes")
    try:
        plain = run(tmp_path, name="plain", dropout=0.0, hidden=64, optim="adamw_bnb_8bit")
    finally:
        # the Trainer registers its 32-bit override of the embedding in bitsandbytes' process-wide manager, keyed
        # by the parameter's place in its groups: every later bitsandbytes optimizer of this process would take it
        bnb.optim.GlobalOptimManager.get_instance().initialize()
    weights, logs, trainer = run(tmp_path, name="offloaded", dropout=0.0, hidden=64, optim="adamw_bnb_8bit",
                                 hardware=hardware_file)
    assert_same_run(plain[:2], (weights, logs))
    rt = trainer.terastack.engine.runtime
    width = {n: {p.key: p.dtype for p in rt.state_parts(n)}["state1"] for n in ("model.embed_tokens.weight",
                                                                                "model.layers.0.mlp.up_proj.weight")}
    assert width == {"model.embed_tokens.weight": torch.float32, "model.layers.0.mlp.up_proj.weight": torch.uint8}
    # the planner counts the state the store holds: the embedding's at 32 bits
    engine = trainer.terastack.engine
    assert engine.profile.full_width == ("model.embed_tokens.weight",)
    held = sum(part.nbytes(info.shape) for name, info in engine.tensors.items() if info.trainable
               for part in rt.state_parts(name))
    assert engine.profile.optimizer_state_bytes(rt.format) == held
    trainer.terastack.close()


def test_bf16_computes_in_bfloat16(tmp_path, hardware_file, reference):
    """bf16=True: the engine computes in bfloat16 with fp32 masters; close to the plain Trainer's bf16 (autocast)
    run, and not the fp32 run (``reference``)."""
    plain = run(tmp_path, name="plain", bf16=True)
    weights, logs, trainer = run(tmp_path, hardware=hardware_file, name="offloaded", bf16=True)
    assert trainer.terastack.engine.compute_dtype == torch.bfloat16
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(plain[1][:4], logs[:4])) < 0.05
    assert any((weights[k] - reference[k]).abs().max().item() > 1e-4 for k in weights)
    trainer.terastack.close()


def test_the_fill_from_memory_holds_its_writes_within_the_engines_room(tmp_path, hardware_file, monkeypatch):
    """The Trainer's model, in memory, reaches the store with its writes in flight bounded by the engine's room less
    what the fill holds beside them (one tensor made fp32 and its record), as a checkpoint's fill is bounded ([Note:
    the fill within the budget] in terastack.llm.weight_fill); at 8 MiB the bound is below the default in flight."""
    from transformers import Trainer, TrainingArguments

    from terastack.llm import weight_fill
    from terastack.llm.engine.store_layout import FILL_IN_FLIGHT

    bounds = []
    real = weight_fill.initial_writes

    def spy(runtime, room, held):
        writes = real(runtime, room, held)
        bounds.append((room, held, writes.limit))
        return writes

    monkeypatch.setattr(weight_fill, "initial_writes", spy)
    model = tiny_model("llama")
    largest = max(p.numel() for p in model.parameters())
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "run"), **ARGS),
                      train_dataset=token_rows(), data_collator=pad_collate)
    offload(trainer, tmp_path, hardware_file)
    try:
        room = trainer.terastack.engine.fill_room
        assert room is not None and room < FILL_IN_FLIGHT
        assert bounds == [(room, 8 * largest, max(0, room - 8 * largest))]
    finally:
        trainer.terastack.close()
