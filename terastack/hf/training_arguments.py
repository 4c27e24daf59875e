"""A Trainer's ``TrainingArguments`` (and TRL's ``SFTConfig``) as the offloaded engine's job settings.

[Note: one copy of every setting under a Trainer]
What ``TrainingArguments`` says, the engine is told from there and nowhere else: ``offload(...)``'s keywords are
the engine's own settings by their job names (``memory_budget``, ``state_placement``, ``optimizer_chunk``,
``activation_policy``, ``base_format``, ...), and a keyword that ``TrainingArguments`` already decides (``lr``,
``weight_decay``, ``grad_accum``, ``optimizer``...) or that belongs to the job runner a Trainer replaces (the
data, checkpoints, the output) is refused by name, pointing at the argument that decides it. The table, by
setting:

    learning_rate                   the Trainer's scheduler sets each step's rate on the engine's optimizer
    adam_beta1/2, adam_epsilon      betas, eps
    weight_decay                    weight_decay (the Trainer's no-decay group: biases and norms, exempt)
    max_grad_norm                   max_grad_norm (the engine clips; 0 turns clipping off)
    gradient_accumulation_steps     grad_accum (the engine's vertical order where it fits, as in finetune)
    per_device_train_batch_size     batch_size (one packed row of them with TRL's padding-free batches)
    seed                            seed (the engine's own draws: the family check's probe batch)
    bf16                            dtype bfloat16 (fp32 masters and optimizer state); else float32
    gradient_checkpointing          activation_policy recompute (every decoder layer; ``every_n_layers`` N:
                                    one in N, the others kept; ``offload``: host instead of kept)
    optim                           optimizer and optimizer_impl (``SERVED_OPTIMIZERS``)

The learning-rate schedule (``lr_scheduler_type`` and its kwargs, warmup), the length (``max_steps``,
``num_train_epochs``) and the data order (``data_seed``, ``group_by_length``, ...) stay the Trainer's: it owns
its loop and the engine runs the steps it is given.
"""
from __future__ import annotations

#: ``TrainingArguments.optim`` -> (the engine's optimizer, its implementation; None: as torch picks for the device)
SERVED_OPTIMIZERS = {"adamw_torch": ("adamw", None), "adamw_torch_fused": ("adamw", "fused"),
                     "adamw_bnb_8bit": ("adamw8bit", None), "adamw_8bit": ("adamw8bit", None)}

#: job settings a Trainer's arguments decide -> the argument that does
FROM_ARGUMENTS = {
    "lr": "learning_rate", "betas": "adam_beta1/adam_beta2", "eps": "adam_epsilon", "weight_decay": "weight_decay",
    "max_grad_norm": "max_grad_norm", "grad_accum": "gradient_accumulation_steps",
    "batch_size": "per_device_train_batch_size", "seed": "seed", "optimizer": "optim", "optimizer_impl": "optim",
    "dtype": "bf16", "steps": "max_steps", "epochs": "num_train_epochs", "lr_schedule": "lr_scheduler_type",
    "warmup_steps": "warmup_steps", "warmup_ratio": "warmup_steps (a ratio below 1)", "min_lr": "lr_scheduler_kwargs",
    "lora": "the peft_config / PeftModel", "lora_alpha": "the peft_config / PeftModel",
    "lora_dropout": "the peft_config / PeftModel", "lora_target_modules": "the peft_config / PeftModel",
    "lora_init_from": "the PeftModel", "store": "offload(store=...)",
    "device": "TrainingArguments' device (use_cpu)"}
#: the engine's settings offload() takes by keyword (the rest of the job is the Trainer's or another engine's)
ENGINE_SETTINGS = ("seq_len", "pack", "optimizer_schedule", "active_offload", "activation_policy", "accumulation",
                   "device_budget", "host_budget", "memory_budget", "base_format", "calibrate", "hardware",
                   "prefetch_depth", "inline_updates", "state_placement", "optimizer_chunk",
                   "retain_weights", "timeout", "check_family", "vocab_slice")


def check_settings(settings: dict) -> None:
    """Refuse, in one line, a keyword that is not the engine's to take ([Note: one copy of every setting under a
    Trainer])."""
    for name in settings:
        if name in FROM_ARGUMENTS:
            raise ValueError(f"offload(): {name} is set by {FROM_ARGUMENTS[name]} (TrainingArguments decides it; "
                             "one copy of every setting)")
        if name not in ENGINE_SETTINGS:
            raise ValueError(f"offload(): {name} is not an engine setting offload() takes (it takes "
                             f"{', '.join(ENGINE_SETTINGS)})")


def activation_policy(args) -> str | None:
    """The engine's activation policy for ``gradient_checkpointing`` (None: not asked, the planner chooses)."""
    if not getattr(args, "activation_checkpointing", None) and not getattr(args, "gradient_checkpointing", None):
        return None
    kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None)
                  or getattr(args, "gradient_checkpointing_kwargs", None) or {})
    every = int(kwargs.get("every_n_layers", 1))
    others = "host" if kwargs.get("offload") else "keep"
    return ",".join(["recompute"] + [others] * (every - 1))


def job_settings(args, *, device: str, settings: dict) -> dict:
    """The engine's settings (flat job names) of ``args`` (TrainingArguments) with offload()'s ``settings``."""
    optimizer, impl = SERVED_OPTIMIZERS[str(getattr(args.optim, "value", args.optim))]
    if impl is None:  # torch.optim.AdamW's own choice: one tensor at a time on a CPU, foreach on a GPU
        impl = "foreach" if device.startswith("cuda") else "single"
    out = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon,
           "weight_decay": args.weight_decay, "max_grad_norm": args.max_grad_norm or None,
           "grad_accum": args.gradient_accumulation_steps, "batch_size": args.per_device_train_batch_size,
           "seed": args.seed, "optimizer": optimizer, "optimizer_impl": impl,
           "dtype": "bfloat16" if args.bf16 else "float32", "device": device}
    policy = activation_policy(args)
    given = settings.get("activation_policy")
    if policy is not None and given not in (None, policy):
        raise ValueError(f"offload(): activation_policy={given!r} contradicts gradient_checkpointing=True (the "
                         f"engine's {policy!r}); give one of them")
    if policy is not None:
        out["activation_policy"] = policy
    return {**out, **settings}
