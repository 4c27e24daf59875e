"""What TRL's ``SFTTrainer.compute_loss`` logs besides the loss, from the engine's steps: per micro-batch the mean
entropy of the next-token distribution (``entropy``) and the share of target tokens predicted first
(``mean_token_accuracy``), and the tokens trained on so far (``num_tokens``: the attention mask's ones, or a
padding-free row's length), into the trainer's ``_metrics``, which its ``log`` averages into each log line.

In evaluation the same figures come from the model's own forward on the engine's weights (TRL's fused head reads
the head's weight directly, which rests in the engine's store: :func:`eval_loss` computes the loss and figures
from the logits instead, as TRL's head computes them)."""
from __future__ import annotations

from terastack.hf.step_figures import StepFigures


def record_train_figures(trainer, figures: StepFigures, batches: list[dict]) -> None:
    """The train figures of one engine step's micro-batches, appended as TRL's ``compute_loss`` appends them."""
    metrics = trainer._metrics["train"]
    for entropy, accuracy, batch in zip(figures.means(figures.entropy), figures.means(figures.top1), batches):
        metrics["entropy"].append(entropy)
        metrics["mean_token_accuracy"].append(accuracy)
        trainer._total_train_tokens += _tokens(batch) // trainer._tp_size
    metrics["num_tokens"] = [trainer._total_train_tokens]


def _tokens(batch: dict) -> int:
    if batch.get("attention_mask") is not None:
        return int(batch["attention_mask"].sum())
    if batch.get("position_ids") is not None:
        return int(batch["position_ids"].size(1))
    raise ValueError("Expected 'attention_mask' or 'position_ids' in inputs.")


def eval_loss(trainer, model, causal_lm, inputs: dict, *, return_outputs: bool):
    """``SFTTrainer.compute_loss`` outside training (its loss, and the figures into ``_metrics``)."""
    mode = "train" if trainer.model.training else "eval"
    inputs = {k: v for k, v in inputs.items() if k != "use_cache"}
    figures = StepFigures([inputs["input_ids"].shape[0]])
    with figures.reading(causal_lm):
        outputs = model(**inputs, use_cache=False)
    metrics = trainer._metrics[mode]
    metrics["entropy"].append(figures.means(figures.entropy)[0])
    metrics["mean_token_accuracy"].append(figures.means(figures.top1)[0])
    metrics["num_tokens"] = [trainer._total_train_tokens]
    loss = outputs.loss
    return (loss, outputs) if return_outputs else loss
