"""One training step, top to bottom: the hand-offs between weight fetcher, units, autograd and optimizer.

[Note: the step schedule]
One step is one loop over the units, written as prologue / steady state /
epilogue. The loop itself is the model's own forward and autograd's backward
(hooks on the unmodified ``transformers`` model: each unit's stand-in runs
:class:`terastack.llm.units.UnitRunner`); :func:`train_step` below shows every
stage in the order it happens:

prologue      prefetch the first unit's weights (after its pending update)
forward       per unit (``UnitRunner.forward``): prefetch next, acquire,
              compute, save activations by policy, release
backward      per unit, in reverse (``UnitRunner.backward``): prefetch
              previous (weights + swapped activations), the optimizer's
              schedule may read state ahead, acquire, recompute if planned,
              gradients, release (an fp32 master may be handed over), hand the
              gradients to the optimizer (eager: its update starts)
epilogue      global norm and clip coefficient; the schedule's end of backward
              (deferred: updates queued in forward order; after_backward:
              awaited); sweep unused prefetches

Updates that are still running when ``step`` returns overlap with the next
step's forward; a unit's weights are fetched only after their update is done,
and anything that reads the weights (checkpoints, export) waits for all. When
each schedule runs its updates: :mod:`terastack.llm.schedules`.
"""
from __future__ import annotations

from terastack import trace


def train_step(model, rt, *, input_ids, labels, attention_mask, step_index: int):
    """One forward, backward and optimizer step of ``model`` (its units installed for runtime ``rt``); returns
    the model's output (its ``loss`` is this step's)."""
    fetcher, opt = rt.fetcher, rt.optimizer
    with trace.span(f"step {step_index}", track="step"):
        # -- prologue: the first units' weights start travelling (each after its pending update)
        opt.begin_step()
        fetcher.begin_forward()
        for u in fetcher.first_units():
            fetcher.prefetch(u)
        # -- forward: the model calls each unit's stand-in -> UnitRunner.forward
        #    (prefetch next | acquire | compute, saving activations by policy | release)
        with trace.span("forward", track="phase"):
            out = model(input_ids=input_ids, labels=labels, attention_mask=attention_mask, use_cache=False)
        fetcher.end_forward()   # the order units ran in: backward prefetches by it, and the next step
        opt.begin_backward()    # ... and which unit's backward completes which tensor's gradient
        # -- backward: autograd runs each unit's backward in reverse -> UnitRunner.backward
        #    (prefetch previous | opt.prepare: schedule.on_unit_backward | acquire | recompute if planned |
        #     gradients | release, handing masters over | opt.accept: schedule.on_grads_ready)
        with trace.span("backward", track="phase"):
            out.loss.backward()
        # -- epilogue: clip coefficient, schedule.on_backward_end; unused prefetches dropped
        with trace.span("epilogue", track="phase"):
            opt.end_step()
            fetcher.sweep()
    return out


def eval_loss(model, rt, *, input_ids, labels) -> float:
    """The loss of a batch without training on it: a forward with weights streamed as in training."""
    rt.fetcher.begin_forward()
    out = model(input_ids=input_ids, labels=labels, use_cache=False)
    rt.fetcher.sweep()
    return float(out.loss)
