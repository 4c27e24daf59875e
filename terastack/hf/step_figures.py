"""Per micro-batch figures of an engine step, read from the logits before the loss consumes them.

[Note: a micro-batch's figures inside one engine step]
The Trainer's loop asks for one loss per micro-batch (it adds them up for its ``loss`` log), and TRL's
``SFTTrainer`` logs, per micro-batch, the mean entropy of the next-token distribution and the share of target
tokens that are the distribution's most likely token. The engine runs the micro-batches of an optimizer step as
it plans: stacked into one forward (the vertical order) or one forward each, and its causal-LM loss writes the
logits' gradient over them ([Note: the loss in place] in terastack.llm.engine.causal_loss). So the model's loss
function is wrapped for the step (:class:`StepFigures`): it reads the logits of every row with a target, in row
chunks of the loss's own size, then hands them to the engine's loss. Rows are numbered across the step's forwards
in the order the micro-batches were given, which is the order both the stacked and the one-by-one passes take
them, so each row's figures land in its micro-batch.

A micro-batch's loss is its rows' negative log-likelihood summed, over the step's count of target tokens (the
Trainer's ``num_items_in_batch``): the token-weighted loss the Trainer logs, split as the Trainer splits it. The
entropy is ``logsumexp(z) - sum(softmax(z) * z)`` and a token is "top-1" when it is the first index of the
maximum (``argmax``), as TRL's fused head counts them.
"""
from __future__ import annotations

import contextlib

import torch

from terastack.llm.engine import causal_loss

IGNORE = -100


class StepFigures:
    """Figures of the micro-batches of one step: ``rows`` per micro-batch, in order."""

    def __init__(self, rows: list[int]):
        self.bounds = torch.tensor(rows, dtype=torch.long).cumsum(0)
        n = len(rows)
        self.nll = torch.zeros(n, dtype=torch.float64)
        self.entropy = torch.zeros(n, dtype=torch.float64)
        self.top1 = torch.zeros(n, dtype=torch.float64)
        self.targets = torch.zeros(n, dtype=torch.float64)
        self._row = 0   # rows seen by the forwards of the step so far

    @torch.no_grad()
    def observe(self, logits: torch.Tensor, labels: torch.Tensor | None, shift_labels: torch.Tensor | None) -> None:
        """Read one forward's logits (batch, seq, vocab) against its labels (shifted as the causal-LM loss shifts
        them)."""
        if labels is None and shift_labels is None:
            return
        batch, length, vocab = logits.shape
        if shift_labels is None:
            shift_labels = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:]
        targets = shift_labels.reshape(-1).to(logits.device)
        where = (targets != IGNORE).nonzero().squeeze(1)
        owner = torch.bucketize(self._row + where.cpu() // length, self.bounds, right=True)
        self._row += batch
        flat = logits.reshape(-1, vocab)
        step = causal_loss.chunk_rows(vocab)
        for lo in range(0, where.numel(), step):
            idx = where[lo:lo + step]
            z = flat[idx].float()
            t = targets[idx]
            log_p = torch.log_softmax(z, dim=-1)
            mb = owner[lo:lo + step]
            self.nll.index_add_(0, mb, -log_p.gather(1, t.unsqueeze(1)).squeeze(1).double().cpu())
            self.entropy.index_add_(0, mb, -(log_p.exp() * log_p).sum(-1).double().cpu())
            self.top1.index_add_(0, mb, (z.argmax(-1) == t).double().cpu())
            self.targets.index_add_(0, mb, torch.ones_like(mb, dtype=torch.float64))

    def losses(self, num_items: float | None = None) -> list[float]:
        """Each micro-batch's share of the step's loss: its summed negative log-likelihood over ``num_items``
        (default: the step's target tokens)."""
        total = float(self.targets.sum()) if num_items is None else float(num_items)
        return [float(x) / max(total, 1.0) for x in self.nll]

    def means(self, values: torch.Tensor) -> list[float]:
        """Per micro-batch mean of ``values`` over its target tokens (0 where it has none, as TRL logs it)."""
        return [float(v) / float(n) if n > 0 else 0.0 for v, n in zip(values, self.targets)]

    @contextlib.contextmanager
    def reading(self, causal_lm):
        """Within: ``causal_lm``'s loss reads the logits first ([Note: a micro-batch's figures inside one engine
        step]), then computes the engine's causal-LM loss."""
        before = causal_lm.__dict__.get("_loss_function", _UNSET)

        def loss_function(logits, labels=None, vocab_size=None, **kwargs):
            self.observe(logits.detach(), labels, kwargs.get("shift_labels"))
            return causal_loss.causal_lm_loss(logits, labels, vocab_size, **kwargs)

        causal_lm.loss_function = loss_function
        try:
            yield self
        finally:
            if before is _UNSET:
                del causal_lm._loss_function
            else:
                causal_lm._loss_function = before


_UNSET = object()
