"""Per-step metrics of a fine-tuning job: JSON lines (``metrics.jsonl``) and, when installed, TensorBoard.

Each optimizer step is one line ``{"step", "epoch", "loss", "lr", "grad_norm", "tokens", "target_tokens",
"seconds", "tokens_per_s", "model_tflops", "ssd_read_bytes", "ssd_write_bytes", "device_in_bytes"}`` taken from
the trainer's :class:`~terastack.llm.trainer.StepStats`; ``grad_norm`` is null where the step did not measure it
(it is measured when clipping). ``tokens`` counts the real tokens of the step's batches (padding left out:
:func:`count_tokens`), ``target_tokens`` those in the loss; ``tokens_per_s`` and ``model_tflops`` are of real
tokens. Each evaluation is one line ``{"step", "val_loss", "val_ppl"}``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from terastack.training.data.examples import IGNORE


def count_tokens(micro_batches: Sequence[Mapping], *, pad_id: int | None = None) -> tuple[int, int]:
    """(real tokens, target tokens) of a step's micro-batches (``Trainer.step`` arguments). A row is padded on
    the right with ``pad_id`` outside the loss (labels -100): its real tokens end at the last position that is
    not such a pad (a pad id that is also the end-of-sequence token still counts where it is in the loss). An
    ``attention_mask`` counts its ones. Target tokens: labels other than -100 after the shift, as the loss
    counts them."""
    import torch

    real = targets = 0
    for mb in micro_batches:
        ids = torch.as_tensor(mb["input_ids"])
        ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
        labels = mb.get("labels")
        labels = ids if labels is None else torch.as_tensor(labels).reshape(ids.shape)
        mask = mb.get("attention_mask")
        if mask is not None:
            real += int(torch.as_tensor(mask).sum())
        elif pad_id is None:
            real += ids.numel()
        else:
            keep = (ids != pad_id) | (labels != IGNORE)
            width = ids.shape[1]
            # the index after the last kept position of each row (0 for a row of pads only)
            last = torch.where(keep.any(dim=1), width - keep.flip(1).int().argmax(dim=1), torch.zeros_like(ids[:, 0]))
            real += int(last.sum())
        targets += int((labels[:, 1:] != IGNORE).sum())
    return real, targets


def model_flops_per_token(total_params: int, trainable_params: int) -> int:
    """Training FLOPs per token of a decoder: 2 per parameter in the forward, 2 per parameter for the
    gradients of the activations in the backward, and 2 per *trainable* parameter for the gradients of the
    weights -- ``6 N`` for full fine-tuning, ``4 N + 2 N_trainable`` for LoRA. Attention's own FLOPs (which
    grow with the sequence length) are left out, as in the usual ``6 N`` model-FLOPs count."""
    return 4 * total_params + 2 * trainable_params


def step_record(stats, *, epoch: float, lr: float, flops_per_token: int, tokens: int | None = None,
                target_tokens: int | None = None) -> dict:
    """The metrics line of one optimizer step (``stats``: its StepStats; ``tokens`` and ``target_tokens``: the
    step's real and target tokens, :func:`count_tokens`; without them, every token of the batches)."""
    seconds = stats.seconds
    tokens = stats.tokens if tokens is None else tokens
    return {"step": stats.step, "epoch": round(epoch, 6), "loss": stats.loss, "lr": lr,
            "grad_norm": stats.grad_norm, "tokens": tokens, "target_tokens": target_tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "model_tflops": flops_per_token * tokens / seconds / 1e12 if seconds > 0 else None,
            "ssd_read_bytes": stats.ssd_read_bytes, "ssd_write_bytes": stats.ssd_write_bytes,
            "device_in_bytes": stats.device_in_bytes}


def eval_record(step: int, val_loss: float) -> dict:
    return {"step": step, "val_loss": val_loss, "val_ppl": math.exp(val_loss) if val_loss < 700 else math.inf}


class MetricsLog:
    """Appends metrics lines to ``path`` (flushed per line, so a failed job keeps what it measured) and mirrors
    the numbers to TensorBoard when the ``tensorboard`` package is importable (it is not a dependency).

    ``resume_step``: the step a resumed job starts from; lines of an earlier attempt past it are dropped, so the
    file reads as one run."""

    def __init__(self, path: str | os.PathLike | None, *, resume_step: int | None = None):
        self.path = Path(path) if path is not None else None
        self._file = None
        self._tb = None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except ValueError:
                    pass  # a line torn by a crash
        self._file = open(self.path, "w")
        for line in kept:
            self._file.write(line + "\n")
        self._file.flush()
        if importlib.util.find_spec("tensorboard") is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.path.parent / "tensorboard"))

    def write(self, record: dict) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(f"{'val' if key.startswith('val_') else 'train'}/{key}", value,
                                        record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
