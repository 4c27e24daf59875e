"""What ``terastack.hf.offload`` serves, and the one-line refusal of everything else, before anything is built.

[Note: what a Trainer may bring]
The engine computes one loss, the causal-LM loss of the model's logits (the mean over target tokens, token-weighted
across gradient accumulation), and runs one optimizer, its own AdamW (fp32 or bitsandbytes' 8-bit moments). So
a trainer is served when its loss is that loss and its optimizer one the engine equals:

* ``transformers.Trainer`` and TRL's ``SFTTrainer`` (text, prompt/completion, conversational data, packing), and
  subclasses that leave ``compute_loss`` and ``training_step`` as those two define them;
* ``optim`` one of :data:`~terastack.hf.training_arguments.SERVED_OPTIMIZERS`;
* one process (several: ``terastack dist train``).

Refused by name: another loss (DPO, GRPO, KTO, reward trainers; a ``compute_loss`` override;
``compute_loss_func``; label smoothing; TRL's ``loss_type="dft"``, its MoE auxiliary loss, liger kernels), an
optimizer or scheduler handed to the Trainer, a model the Trainer re-creates (``model_init``), and the settings
that change the forward or the arithmetic underneath the engine (fp16, ``torch_compile``, NEFTune noise,
DeepSpeed, FSDP, TRL's activation offloading).
"""
from __future__ import annotations

import sys

from terastack.hf.training_arguments import SERVED_OPTIMIZERS

#: what offload() serves, for the refusals' second half
SERVED = ("transformers.Trainer and TRL's SFTTrainer (and subclasses that keep their compute_loss and "
          "training_step), with the model's causal-LM loss")


def _refuse(what: str) -> None:
    raise ValueError(f"terastack.hf.offload: {what}")


def trainer_kind(trainer) -> str:
    """"sft" for TRL's SFTTrainer (or a subclass), "trainer" for transformers' Trainer; anything else refused."""
    from transformers import Trainer

    cls = type(trainer)
    if not isinstance(trainer, Trainer):
        _refuse(f"{cls.__name__} is not a transformers Trainer; served: {SERVED}")
    sft = _sft_class()
    base = sft if sft is not None and isinstance(trainer, sft) else Trainer
    # the engine computes the loss and runs forward and backward itself: a class that changes either is refused
    for method in ("compute_loss", "training_step"):
        mine = getattr(cls, method)
        theirs = getattr(base, method)
        if mine is not theirs:
            owner = next(c.__name__ for c in cls.__mro__ if method in c.__dict__)
            _refuse(f"{cls.__name__} overrides {method} ({owner}.{method}), whose loss the engine cannot compute; "
                    f"served: {SERVED}")
    if base is Trainer and cls.__module__.startswith("trl"):
        _refuse(f"{cls.__name__} trains another loss than the causal LM's; served: {SERVED}")
    return "sft" if base is sft else "trainer"


def _sft_class():
    """TRL's SFTTrainer when TRL is imported (a trainer of its classes imported it; a plain Trainer's offload does not
    pay for importing it)."""
    trl = sys.modules.get("trl")
    return getattr(trl, "SFTTrainer", None) if trl is not None else None


def check_model_loss(causal_lm) -> None:
    """Refuse a model whose forward computes its loss otherwise than through transformers' causal-LM loss
    (``self.loss_function``, ``ForCausalLMLoss``): the engine's loss and the logs read it there."""
    from terastack.llm.engine.causal_loss import applies

    if not applies(causal_lm):
        _refuse(f"{type(causal_lm).__name__} computes its loss without transformers' causal-LM loss "
                f"(ForCausalLMLoss through self.loss_function): another loss; served: {SERVED}")


def check_trainer(trainer, kind: str) -> None:
    """Refuse what the engine cannot equal ([Note: what a Trainer may bring])."""
    args = trainer.args
    optim = str(getattr(args.optim, "value", args.optim))
    if optim not in SERVED_OPTIMIZERS:
        _refuse(f"optim={optim!r} has no equal in terastack; served: {', '.join(SERVED_OPTIMIZERS)}")
    checks = [
        (args.world_size > 1, f"{args.world_size} processes; offload() trains in one process (for data-parallel "
                              "training over several, use `terastack dist train`)"),
        (trainer.optimizer is not None or trainer.lr_scheduler is not None,
         "an optimizer or scheduler given to the Trainer (optimizers=...); the engine's optimizer is built from "
         "TrainingArguments.optim"),
        (getattr(trainer, "optimizer_cls_and_kwargs", None) is not None,
         "optimizer_cls_and_kwargs; the engine's optimizer is built from TrainingArguments.optim"),
        (bool(args.optim_args), f"optim_args={args.optim_args!r}; {optim} is served with its defaults"),
        (trainer.model_init is not None, "model_init (the Trainer would re-create the model the engine holds)"),
        (trainer.compute_loss_func is not None, f"compute_loss_func, another loss; served: {SERVED}"),
        (trainer.label_smoother is not None, f"label_smoothing_factor={args.label_smoothing_factor}, another "
                                             f"loss; served: {SERVED}"),
        (bool(args.fp16 or args.fp16_full_eval or args.bf16_full_eval),
         "fp16 / fp16_full_eval / bf16_full_eval; served: float32, or bf16=True (bfloat16 compute, fp32 masters)"),
        (bool(args.torch_compile), "torch_compile (the engine runs the model's own modules unit by unit)"),
        (args.neftune_noise_alpha is not None, "neftune_noise_alpha (noise hooks on the embedding)"),
        (bool(args.deepspeed) or trainer.is_deepspeed_enabled, "deepspeed; the engine is the offloading"),
        (bool(args.fsdp) or trainer.is_fsdp_enabled, "fsdp; offload() trains in one process"),
        (bool(args.use_liger_kernel), "use_liger_kernel (another loss kernel)"),
        (bool(args.auto_find_batch_size), "auto_find_batch_size (the engine plans for one batch size)"),
        (getattr(trainer, "is_model_parallel", False), "a model split across devices (device_map)"),
    ]
    if kind == "sft":
        checks += [
            (args.loss_type != "nll", f"loss_type={args.loss_type!r}; served: 'nll'"),
            (bool(getattr(trainer, "aux_loss_enabled", False)), "the MoE router's auxiliary loss "
                                                                "(router_aux_loss_coef=0 turns it off)"),
            (bool(args.activation_offloading), "activation_offloading (the engine places activations: its "
                                               "activation_policy setting)"),
            (bool(getattr(trainer, "_is_vision_dataset", False)), "vision datasets"),
        ]
    for refused, what in checks:
        if refused:
            _refuse(what)
    ga = args.gradient_accumulation_steps
    scaled = getattr(trainer, "loss_is_scaled_for_ga", None)
    if ga > 1 and not (trainer.model_accepts_loss_kwargs if scaled is None else scaled):
        _refuse(f"gradient_accumulation_steps={ga} with a model whose forward takes no num_items_in_batch (the "
                "Trainer would average per-micro-batch means; the engine weights every target token alike)")
