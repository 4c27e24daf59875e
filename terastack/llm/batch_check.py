"""A training batch checked before it reaches the streamed model: shapes within the plan's, token ids within the
vocabulary, masks and positions that agree with the ids, packed rows only where the plan counted them. A wrong
batch is refused with the argument named, before any weight moves."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from terastack.training.data.examples import IGNORE
from terastack.training.hf.model_files import check_packing


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchCheck:
    """The batches a trainer's plan admits: at most ``batch_size`` x ``seq_len`` tokens a micro-batch, rows at
    most ``seq_len`` long, token ids below the vocabulary of ``hf_config``; packed rows if ``packed``."""

    hf_config: object
    batch_size: int
    seq_len: int
    packed: bool
    device: torch.device

    def inputs(self, input_ids, labels, attention_mask, position_ids, *, where: str = "") -> dict:
        """The model call's keyword arguments, validated (``where``: the micro-batch named in errors)."""
        prefix = f"{where}." if where else ""
        ids = self.as_batch(input_ids, "input_ids", prefix)
        inputs = {"input_ids": ids, "labels": ids if labels is None else self.as_batch(labels, "labels", prefix),
                  "attention_mask": None if attention_mask is None
                  else self.as_batch(attention_mask, "attention_mask", prefix)}
        for what in ("labels", "attention_mask"):
            if inputs[what] is not None and inputs[what].shape != ids.shape:
                raise ValueError(f"{prefix}{what}: shape {tuple(inputs[what].shape)} differs from input_ids' "
                                 f"{tuple(ids.shape)}")
        if position_ids is not None:
            inputs["position_ids"] = self.positions(position_ids, ids, attention_mask, prefix)
        return inputs

    def positions(self, position_ids, ids: torch.Tensor, attention_mask, prefix: str) -> torch.Tensor:
        pos = self.as_batch(position_ids, "position_ids", prefix)
        if pos.shape != ids.shape:
            raise ValueError(f"{prefix}position_ids: shape {tuple(pos.shape)} differs from input_ids' "
                             f"{tuple(ids.shape)}")
        if pos.numel() and int(pos.min()) < 0:
            raise ValueError(f"{prefix}position_ids: must be >= 0, got {int(pos.min())}")
        if pos.shape[1] > 1 and bool((pos[:, 1:] - pos[:, :-1] != 1).any()):
            # restarts inside a row: packed examples, which need the block-diagonal mask transformers
            # derives from position ids only when no 2D mask is given
            check_packing(self.hf_config, where=f"{prefix}position_ids")
            if not self.packed:
                raise ValueError(f"{prefix}position_ids: packed rows (positions restarting inside a row), but "
                                 "the plan was made for unpacked batches; set TrainerConfig.packed=True (the "
                                 "attention mask of packed rows takes activation memory the plan must count)")
            if attention_mask is not None:
                raise ValueError(f"{prefix}attention_mask: packed rows (position_ids restarting inside a row) "
                                 "take no attention mask; the attention within each example comes from the "
                                 "position ids")
        return pos

    def as_batch(self, x, what: str, prefix: str = "") -> torch.Tensor:
        t = torch.as_tensor(x)
        if t.dim() == 1:
            t = t.unsqueeze(0)
        if t.dim() != 2:
            raise ValueError(f"{prefix}{what}: expected a (batch, seq) tensor of token ids, got shape "
                             f"{tuple(t.shape)}")
        if t.shape[0] * t.shape[1] > self.batch_size * self.seq_len or t.shape[1] > self.seq_len:
            raise ValueError(f"{prefix}{what}: batch shape {tuple(t.shape)} exceeds the planned "
                             f"({self.batch_size}, {self.seq_len}); set TrainerConfig.batch_size/"
                             "seq_len to the largest batch you will train on")
        vocab = getattr(self.hf_config, "vocab_size", None)
        if what in ("input_ids", "labels") and vocab is not None and t.numel():
            lo, hi = int(t.min()), int(t.max())
            if hi >= vocab or (lo < 0 and not (what == "labels" and lo == IGNORE)):
                raise ValueError(f"{prefix}{what}: token ids must be in [0, {vocab}) for this model, got [{lo}, {hi}]")
        return t.to(self.device, torch.long)
