"""The causal-LM loss of an engine step, computed over the logits in row chunks with its gradient written in place.

[Note: the loss in place]
transformers' causal-LM loss (``ForCausalLMLoss``) upcasts the logits to fp32 and runs ``cross_entropy`` over
all of them: the logits, their log-softmax (saved for backward) and, in backward, the gradient of each live at
once, about three fp32 copies of batch x sequence x vocabulary. That is the largest working memory of a step's
last unit, and the vertical order multiplies it by the micro-batches it stacks: at 1.1B (vocabulary 32000)
with 8 micro-batches of 256 tokens, 786 MB of a 4 GiB budget, which the host tier then lacks for weights.

During an engine step the model's loss is this module's instead, with the same arguments and the same value:
the logits are visited in chunks of rows (``LOSS_CHUNK_BYTES`` of fp32 each, terastack.plan.llm_profile); a
chunk's log-softmax gives its rows' losses (``nll_loss``), and the chunk is then overwritten with its gradient,
computed by the kernel the loss's own backward runs (``_log_softmax_backward_data`` with -1/n at each row's
target, zero rows where the label is ignored) and cast to the logits' dtype as autograd would cast it. The loss
is the sum over chunks divided by ``n`` (the step's ``num_items_in_batch``, else the targets counted). Backward
hands that buffer on (times the incoming scalar). So a step holds the logits once, in the compute dtype, plus a
few chunks' fp32 rows: 1.1B at 8 micro-batches needs about 330 MB there, not 786 MB. The gradient is
transformers' to the bit (rows are independent, and each is computed by the same kernels); only the loss's sum
over rows is reassociated, by chunk.

The logits' values are gone once the loss has run: the engine drops ``out.logits`` from the step's output, and
the loss runs in place only inside the engine's own step (:func:`installed`), so a model called by anyone else
computes transformers' loss. A model whose loss is not transformers' causal-LM loss (another ``loss_type``, or
loss code of its own) keeps it: :func:`applies` says which, and the planner prices each
(``ModelProfile.loss_bytes``).
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import torch

from terastack.plan.llm_profile import LOSS_CHUNK_BYTES


def chunk_rows(vocab: int) -> int:
    """Rows per chunk for a vocabulary of ``vocab`` logits."""
    return max(1, LOSS_CHUNK_BYTES // (4 * max(1, vocab)))


class _LossInPlace(torch.autograd.Function):
    """Sum of the rows' cross-entropy over ``n``, with the gradient written into the logits (see the Note)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, n: torch.Tensor, ignore_index: int):
        rows = chunk_rows(logits.shape[-1])
        inv = 1.0 / n  # what the division by n hands backward
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for lo in range(0, logits.shape[0], rows):
            part = logits[lo:lo + rows]
            t = targets[lo:lo + rows]
            valid = t != ignore_index
            log_p = torch.log_softmax(part.float(), dim=-1)
            total += torch.nn.functional.nll_loss(log_p, t, ignore_index=ignore_index, reduction="sum")
            # the gradient the loss's own backward computes, by the same kernel: -1/n at each row's target
            upstream = torch.zeros_like(log_p).scatter_(
                1, torch.where(valid, t, torch.zeros_like(t)).unsqueeze(1), (-inv * valid).unsqueeze(1))
            part.copy_(torch.ops.aten._log_softmax_backward_data(upstream, log_p, -1, torch.float32))
            del log_p, upstream
        ctx.gradient = logits
        return total / n

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        gradient, ctx.gradient = ctx.gradient, None
        return gradient.mul_(grad_out.to(gradient.dtype)), None, None, None


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor | None = None, vocab_size: int | None = None,
                   num_items_in_batch=None, ignore_index: int = -100, shift_labels: torch.Tensor | None = None,
                   **kwargs) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` with its arguments, computed in place ([Note: the loss in place]) when
    the logits carry a gradient and can be written; otherwise transformers' own."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    if not (torch.is_grad_enabled() and logits.requires_grad and logits.grad_fn is not None
            and logits.is_contiguous()):
        return ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                               ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
    if shift_labels is None:
        padded = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = padded[..., 1:]
    targets = shift_labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        n = (targets != ignore_index).sum().to(torch.float32)
    else:
        n = torch.as_tensor(num_items_in_batch, device=logits.device).to(torch.float32)
    return _LossInPlace.apply(logits.view(-1, vocab_size), targets, n, ignore_index)


@functools.cache
def _forward_calls_loss_function(cls: type) -> bool:
    try:
        return "self.loss_function(" in inspect.getsource(cls.forward)
    except (OSError, TypeError, AttributeError):
        return False


def applies(model) -> bool:
    """The model computes its loss through transformers' causal-LM loss, which :func:`installed` replaces."""
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss
    except ImportError:
        return False
    return getattr(model, "loss_function", None) is ForCausalLMLoss and _forward_calls_loss_function(type(model))


@contextlib.contextmanager
def installed(model):
    """Within: ``model``'s loss is computed in place where :func:`applies` (for the engine's own step)."""
    if not applies(model):
        yield
        return
    before = model.__dict__.get("_loss_function", _UNSET)
    model.loss_function = causal_lm_loss
    try:
        yield
    finally:
        if before is _UNSET:
            del model._loss_function
        else:
            model._loss_function = before


_UNSET = object()
