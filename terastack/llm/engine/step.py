"""One training step, top to bottom: the hand-offs between weight fetcher, units, autograd and optimizer.

[Note: the step schedule]
One step is one loop over the units, written as prologue / steady state /
epilogue. The loop itself is the model's own forward and autograd's backward
(hooks on the unmodified ``transformers`` model: each unit's stand-in runs
:class:`terastack.llm.engine.streamed_units.UnitRunner`); :func:`train_step` below shows every
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

An accumulated step in the vertical order runs this once, on the step's
micro-batches stacked into one batch (each unit's forward and backward for all
of them at once, its weights read once each way;
:func:`terastack.llm.engine.accumulate.stack_micro_batches`). In the horizontal
order (:func:`accumulated_step`) it runs once per micro-batch; all but the last
only add their gradients to the sums (no update, no optimizer state read;
[Note: gradient accumulation] in terastack.llm.engine.accumulate), so the
schedule's updates run in the last one. [Note: vertical and horizontal
accumulation] in terastack.plan.accumulation_specs.

Updates that are still running when ``step`` returns overlap with the next
step's forward; a unit's weights are fetched only after their update is done,
and anything that reads the weights (checkpoints, export) waits for all. When
each schedule runs its updates: :mod:`terastack.llm.engine.schedules`.
"""
from __future__ import annotations

import torch

from terastack import trace
from terastack.llm.engine import causal_loss
from terastack.llm.engine.step_points import StopForward
from terastack.training.rng_state import set_rng_states


def train_step(model, rt, *, inputs: dict, step_index: int, accumulate: bool = False, label: str | None = None,
               track: str = "step"):
    """One forward and backward of ``model`` (its units installed for runtime ``rt``) on ``inputs`` (the model
    call's keyword arguments: ``input_ids``, ``labels``, and any of ``attention_mask``, ``position_ids``,
    ``num_items_in_batch``), and the optimizer step that closes it; returns the model's output (its ``loss`` is
    this step's; its logits are not kept, [Note: the loss in place] in terastack.llm.engine.causal_loss).
    ``accumulate``: a micro-batch of an accumulated step other than the last, whose backward only
    adds to the gradient sums ([Note: gradient accumulation] in terastack.llm.engine.accumulate). ``label`` and
    ``track``: its span in the trace (a micro-batch of an accumulated step is not a step of its own)."""
    fetcher, opt = rt.fetcher, rt.optimizer
    with trace.span(label or f"step {step_index}", track=track):
        # -- prologue: the first units' weights start travelling (each after its pending update)
        opt.begin_step(accumulate=accumulate)
        fetcher.begin_forward()
        for u in fetcher.first_units():
            fetcher.prefetch(u)
        # -- forward: the model calls each unit's stand-in -> UnitRunner.forward
        #    (prefetch next | acquire | compute, saving activations by policy | release)
        with trace.span("forward", track="phase"), causal_loss.installed(model):
            out = model(**inputs, use_cache=False)
        if "logits" in out:  # the loss has turned them into its gradient ([Note: the loss in place])
            out["logits"] = None
        fetcher.end_forward()   # the order units ran in: backward prefetches by it, and the next step
        if rt.runner.points is not None:  # [Note: points inside a step] in terastack.llm.engine.step_points
            rt.runner.points.forward_done(out.loss, fetcher.order)
        opt.begin_backward()    # ... and which unit's backward completes which tensor's gradient
        # -- backward: autograd runs each unit's backward in reverse -> UnitRunner.backward
        #    (prefetch previous | opt.prepare: schedule.on_unit_backward | acquire | recompute if planned |
        #     gradients | release, handing masters over | opt.accept: schedule.on_grads_ready, or, accumulating,
        #     the gradient joins its sum)
        with trace.span("backward", track="phase"):
            out.loss.backward()
        # -- epilogue: clip coefficient, schedule.on_backward_end (not while accumulating); unused prefetches
        #    dropped
        with trace.span("epilogue", track="phase"):
            opt.end_step()
            fetcher.sweep()
    return out


def finish_step(model, rt, *, inputs: dict, point, step_index: int) -> float:
    """Finish a step from a point inside it ([Note: points inside a step] in terastack.llm.engine.step_points):
    forward until the unit ``point`` stops at, backward from that unit's inputs with the gradient it saved (the
    units before it compute and update as in the uninterrupted step); the RNG continues as after the step's
    forward. Returns the step's loss (the point's)."""
    fetcher, opt, runner = rt.fetcher, rt.optimizer, rt.runner
    with trace.span(f"step {step_index} (finished from unit {point.unit})", track="step"):
        opt.begin_step()
        fetcher.begin_forward()
        for u in fetcher.first_units():
            fetcher.prefetch(u)
        runner.stop_at = point.unit
        try:
            with trace.span("forward", track="phase"):
                model(**inputs, use_cache=False)
        except StopForward as stop:
            inputs_at_unit = stop.inputs
        else:
            raise RuntimeError(f"finishing a step: the forward never reached unit {point.unit}")
        finally:
            runner.stop_at = None
        fetcher.end_forward()
        if runner.points is not None:  # a following checkpoint takes the points of the rest of the step
            runner.points.resume_step(point, step=step_index)
        # the weights prefetched for the units the forward did not reach: landed, then evicted (a step's
        # backward would have found the device with them released)
        rt.store.wait(timeout=rt.timeout)
        fetcher.sweep()
        opt.begin_backward()
        pairs = [(x, g.to(x.device, x.dtype)) for x, g in zip(inputs_at_unit, point.boundary) if g is not None]
        if len(inputs_at_unit) != len(point.boundary) or not pairs:
            raise ValueError(f"finishing a step: unit {point.unit} takes {len(inputs_at_unit)} input(s) needing a "
                             f"gradient, the point saved {len(point.boundary)}")
        with trace.span("backward", track="phase"):
            torch.autograd.backward([x for x, _ in pairs], [g for _, g in pairs])
        with trace.span("epilogue", track="phase"):
            opt.end_step()
            fetcher.sweep()
    set_rng_states(point.rng_after_forward)
    return point.loss


def accumulated_step(model, rt, micro_batches: list[dict], *, step_index: int) -> list[float]:
    """One optimizer step over several micro-batches (each the keyword arguments of :func:`train_step`'s model
    call, ``num_items_in_batch`` the step's total of target tokens): micro-batches 1..N-1 only accumulate
    gradients, the last one's backward runs the updates. Returns each micro-batch's loss (its share of the step's
    token-weighted loss). See [Note: gradient accumulation] in terastack.llm.engine.accumulate."""
    losses = []
    # one span on the step track for the whole optimizer step ([Note: the step's timeline] reads one per step)
    with trace.span(f"step {step_index}", track="step"):
        for i, inputs in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            out = train_step(model, rt, inputs=inputs, step_index=step_index, accumulate=not last,
                             label=f"step {step_index} micro-batch {i + 1}/{len(micro_batches)}", track="micro-batch")
            losses.append(float(out.loss.detach()))
            del out
    return losses


def eval_loss(model, rt, *, inputs: dict) -> float:
    """The loss of a batch without training on it: a forward with weights streamed as in training."""
    rt.fetcher.begin_forward()
    out = model(**inputs, use_cache=False)
    rt.fetcher.sweep()
    return float(out.loss)
