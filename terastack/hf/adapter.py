"""``terastack.hf.offload``: a Hugging Face ``Trainer`` or TRL ``SFTTrainer`` trained through the offloaded engine.

    trainer = SFTTrainer(model=model, args=SFTConfig(...), train_dataset=data)
    terastack.hf.offload(trainer, store="/nvme/run", memory_budget="24GiB")   # the one added line
    trainer.train()

What is served and refused: terastack.hf.served; how TrainingArguments reach the engine:
terastack.hf.training_arguments; the model and its weights: terastack.hf.model_source; the steps:
terastack.hf.offloaded_run; the Trainer's methods: terastack.hf.offloaded_trainer.
"""
from __future__ import annotations

import weakref

from terastack.hf import served
from terastack.hf.model_source import BASE_FORMAT_ATTR, ModelSource, causal_lm_of, draws_dropout, model_source
from terastack.hf.offloaded_run import OffloadedRun
from terastack.hf.offloaded_trainer import OffloadedTrainer, offloaded_class
from terastack.hf.training_arguments import check_settings, job_settings


def offload(trainer, *, store, device_budget=None, host_budget=None, memory_budget=None, **settings):
    """Make ``trainer`` train through terastack's offloaded engine and return it. ``store``: the directory (on an
    SSD; several with commas between them) where the training state rests, in a scratch subdirectory removed when
    the trainer is closed (``trainer.terastack.close()``) or collected; the budgets and ``settings`` are the
    engine's job settings by their names (``state_placement``, ``activation_policy``, ``optimizer_chunk``,
    ``base_format``, ``seq_len``, ...). The model's weights reach the store here, one tensor at a time."""
    if isinstance(trainer, OffloadedTrainer):
        raise ValueError("terastack.hf.offload: this trainer is offloaded already")
    kind = served.trainer_kind(trainer)
    served.check_trainer(trainer, kind)
    check_settings(settings)
    budgets = {k: v for k, v in (("device_budget", device_budget), ("host_budget", host_budget),
                                 ("memory_budget", memory_budget)) if v is not None}
    model = trainer.model
    served.check_model_loss(causal_lm_of(model))
    base_format = getattr(causal_lm_of(model), BASE_FORMAT_ATTR, None)
    if base_format is not None:  # empty_model(..., quantization_config=BitsAndBytesConfig(nf4))
        settings.setdefault("base_format", base_format)
    decay = set(trainer.get_decay_parameter_names(model))
    flat = job_settings(trainer.args, device=str(trainer.args.device), settings={**budgets, **settings})
    if flat["grad_accum"] > 1 and "accumulation" not in flat and (
            draws_dropout(model) or flat["optimizer"] == "adamw8bit"):
        flat["accumulation"] = "horizontal"  # [Note: the Trainer's order of micro-batches]
    flat.setdefault("seq_len", longest_row(trainer))
    if _padding_free(trainer):  # one row of the batch's examples end to end (TRL's padding-free collator)
        flat.update(pack=True, seq_len=flat["seq_len"] * flat["batch_size"], batch_size=1)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    source = model_source(model)  # from here on a failure puts the model's weights back
    try:
        engine = build_engine(source, flat, store=store, no_decay=[n for n in trainable if n not in decay],
                              full_width_state=full_width_state(model, flat["optimizer"], trainable))
    except BaseException:
        source.restore()
        raise
    source.keep()
    run = OffloadedRun(engine, causal_lm=source.causal_lm, kind=kind)
    trainer.__class__ = offloaded_class(type(trainer), kind)
    trainer.terastack = run
    # accelerate leaves the model where the engine put it: no device move, no autocast wrapper
    source.model._is_accelerate_prepared = True
    weakref.finalize(trainer, run.close)
    return trainer


def _padding_free(trainer) -> bool:
    return bool(getattr(trainer, "padding_free", False))


def longest_row(trainer) -> int:
    """The longest row of the Trainer's data (its ``input_ids``), rounded up as its collator pads
    (``pad_to_multiple_of``): the planned sequence length when ``seq_len`` is not given."""
    longest = 0
    for data in (trainer.train_dataset, *(_eval_sets(trainer.eval_dataset))):
        longest = max(longest, _longest(data))
    if longest == 0:
        raise ValueError("terastack.hf.offload: the Trainer's data has no input_ids column to measure its rows; "
                         "give seq_len=N (the longest row a batch will hold)")
    multiple = getattr(getattr(trainer, "data_collator", None), "pad_to_multiple_of", None)
    if multiple:
        longest = -(-longest // multiple) * multiple
    return longest


def _eval_sets(eval_dataset) -> list:
    if eval_dataset is None:
        return []
    return list(eval_dataset.values()) if isinstance(eval_dataset, dict) else [eval_dataset]


def _longest(data) -> int:
    """The longest ``input_ids`` of a datasets.Dataset, or of a sized dataset of mappings (0: none to measure)."""
    if data is None:
        return 0
    names = getattr(data, "column_names", None)
    if names is not None:
        if "input_ids" not in names:
            return 0
        import pyarrow.compute as pc

        column = data.data.column("input_ids")
        return int(pc.max(pc.list_value_length(column)).as_py() or 0) if len(column) else 0
    try:
        return max((len(row["input_ids"]) for row in data), default=0)
    except (TypeError, KeyError):
        return 0


def full_width_state(model, optimizer: str, trainable: list[str]) -> list[str]:
    """The parameters the Trainer's 8-bit optimizers keep at 32 bits: every ``nn.Embedding`` weight
    (``Trainer.create_optimizer`` registers bitsandbytes' ``optim_bits=32`` override for them); none otherwise."""
    from torch import nn

    if optimizer != "adamw8bit":
        return []
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    ids = {n: id(p) for n, p in model.named_parameters()}
    return [n for n in trainable if ids[n] in embeddings]


def build_engine(source: ModelSource, flat: dict, *, store, no_decay: list[str], full_width_state: list[str]):
    """The offloaded engine over the Trainer's model, its store filled from ``source``."""
    from terastack.hf.engine_fill import fill, lora_of
    from terastack.llm.trainer import Trainer
    from terastack.llm.trainer_config import TrainerConfig

    lora, spec = lora_of(source, flat.get("base_format"))
    config = TrainerConfig(store_dir=str(store), lora=spec, **flat)
    name = getattr(source.hf_config, "_name_or_path", None) or source.hf_config.model_type
    engine = Trainer(source.model, source.hf_config, config, name=str(name), source=None, lora=lora, empty=True,
                     source_dir=source.checkpoint_dir, no_decay=no_decay, full_width_state=full_width_state)
    try:
        fill(engine, source)
    except BaseException:
        engine.close()
        raise
    return engine
