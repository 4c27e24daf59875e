"""The worker side: an unmodified model whose parameters arrive per bucket and whose gradients leave per bucket.

:class:`ShardedModel` wraps a model built with its parameters on the meta
device. Each bucket gets one flat fp32 buffer whose storage is allocated only
while the bucket is in use; the model's parameters are views into it. Hooks do
the rest, so the model's code is untouched:

- forward pre-hook of layer ``b``: wait until the agent has delivered ``b``
  (it was prefetched while earlier layers computed);
- forward hook: release ``b`` (``reshard``), backward pre-hook: wait for its
  second delivery;
- post-accumulate-grad hooks: once every parameter of ``b`` has its gradient,
  flatten them, hand the bucket to the agent and free the parameters. Buckets
  leave in the schedule's gradient order (a bucket complete before the one
  ahead of it waits for it): messages are matched by their order
  ([Note: messages matched by order] in :mod:`terastack.disdp.comm`).

The compute thread never calls into torch.distributed with the thread agent;
the time it spends blocked waiting for a delivery is its *exposed
communication* (``ShardedModel.wait_s``).

[Note: storage resized in place]
A bucket's parameters are views of one flat tensor whose storage is resized to
zero when released and back to full size before the next delivery lands
(FSDP's ``_free_storage`` technique). Autograd saves the parameter tensors
themselves for the backward, so the backward sees the data of the second
delivery; deliveries write raw memory and do not bump version counters.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol

import torch
from torch import nn

from terastack import trace
from terastack.disdp.buckets import Layout, Schedule, find_layers


class WorkerBucket:
    """One bucket's flat parameter buffer on a worker, resident only while in use."""

    def __init__(self, index: int, numel: int, capacity: int | None = None):
        self.index = index
        self.numel = capacity or numel   # a collective may need the buffer padded to a multiple of its group
        self.flat = torch.empty(self.numel, dtype=torch.float32)
        self.params: list[nn.Parameter] = []
        self.released = threading.Event()

    @property
    def resident(self) -> bool:
        return self.flat.untyped_storage().nbytes() > 0

    def materialize(self) -> torch.Tensor:
        storage = self.flat.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.numel * 4)
        return self.flat

    def free(self) -> None:
        self.flat.untyped_storage().resize_(0)
        self.released.set()


class Link(Protocol):
    """What the compute thread asks of its communication agent."""

    def begin_step(self, step: int) -> None: ...
    def wait_params(self, slot: int) -> None: ...
    def released(self, bucket: int) -> None: ...
    def push_grad(self, bucket: int, grad: torch.Tensor) -> float | None:
        """Hand ``grad`` off; the seconds the compute thread waited for the network to take it, if it did."""
    def end_step(self) -> None: ...
    def sent(self) -> None:
        """Wait until every gradient pushed has left the worker."""
    def close(self) -> None: ...
    def abort(self) -> None: ...


class ShardedModel:
    """Hooks an unmodified model so that its parameters are fetched and its gradients pushed per bucket."""

    def __init__(self, model: nn.Module, layout: Layout, schedule: Schedule, *, pad_multiple: int = 1):
        self.model = model
        self.layout = layout
        self.schedule = schedule
        self.link: Link | None = None
        self.buckets = [WorkerBucket(b.index, b.numel, -(-b.numel // pad_multiple) * pad_multiple)
                        for b in layout.buckets]
        self.wait_s = 0.0
        self.peak_param_bytes = 0   # most parameter bytes resident at once (deliveries landed or landing)
        self._slot_of: dict[tuple[int, int], int] = {(f.bucket, f.phase): i for i, f in
                                                      enumerate(schedule.fetch_order)}
        self._grads_seen: list[set[int]] = [set() for _ in self.buckets]
        self._pushed: list[bool] = [False] * len(self.buckets)
        self._ready: set[int] = set()   # buckets whose gradients are complete, not yet pushed
        self._next_push = 0             # index into the schedule's gradient order
        self._acquired: set[tuple[int, int]] = set()   # this step's deliveries waited for
        self._released: set[int] = set()               # buckets released this step
        self._embeddings_run = 0
        self._bind_parameters()
        self._register_hooks()

    # ----------------------------------------------------------------- setup
    def _bind_parameters(self) -> None:
        """Replace every parameter by a view of its bucket's flat buffer (tied weights stay tied)."""
        by_name = dict(self.model.named_parameters())
        replacement: dict[int, nn.Parameter] = {}
        for spec, bucket in zip(self.layout.buckets, self.buckets):
            for slot in spec.params:
                old = by_name[slot.name]
                view = bucket.flat[slot.offset:slot.offset + slot.numel].view(slot.shape)
                new = nn.Parameter(view, requires_grad=old.requires_grad)
                replacement[id(old)] = new
                bucket.params.append(new)
        for bucket in self.buckets:
            bucket.free()   # views exist; the storage is allocated only while the bucket is in use
        for module in self.model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and id(p) in replacement:
                    module._parameters[name] = replacement[id(p)]

    def _register_hooks(self) -> None:
        _, layers = find_layers(self.model)
        for b, layer in enumerate(layers, start=1):
            layer.register_forward_pre_hook(lambda m, a, b=b: self._acquire(b, 0))
            if self.schedule.refetched(b):
                layer.register_forward_hook(lambda m, a, o, b=b: self._release(b))
                layer.register_full_backward_pre_hook(lambda m, g, b=b: self._acquire(b, 1))
        hooked = range(1, len(self.buckets))   # the layers and the head push their gradients as they are ready
        for b in hooked:
            for index, p in enumerate(self.buckets[b].params):
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda p, b=b, i=index: self._grad_ready(b, i))
        if self.layout.head:
            # [Note: what stays resident on a worker] a head bucket is fetched when its module runs
            for head in range(self.layout.layers + 1, len(self.buckets)):
                for module in self._owners(head):
                    module.register_forward_pre_hook(lambda m, a, b=head: self._acquire(b, 0))
            owners = self._owners(0)
            if owners and all(isinstance(m, nn.Embedding) for m in owners):
                # an embedding's backward needs its indices, not its weights: the root leaves once they ran
                for module in owners:
                    module.register_forward_hook(lambda m, a, o, n=len(owners): self._embedded(n))

    def _owners(self, b: int) -> list[nn.Module]:
        """The modules that hold bucket ``b``'s parameters themselves."""
        mine = {id(p) for p in self.buckets[b].params}
        return [m for m in self.model.modules() if any(id(p) in mine for p in m._parameters.values()
                                                       if p is not None)]

    def _embedded(self, embeddings: int) -> None:
        self._embeddings_run += 1
        if self._embeddings_run == embeddings and 0 not in self._released:
            self._release(0)

    # ------------------------------------------------------------ the step
    def begin_step(self, step: int) -> None:
        self._grads_seen = [set() for _ in self.buckets]
        self._pushed = [False] * len(self.buckets)
        self._ready.clear()
        self._next_push = 0
        self._acquired.clear()
        self._released.clear()
        self._embeddings_run = 0
        self.link.begin_step(step)
        self._acquire(0, 0)   # root: the embeddings first ([Note: what stays resident on a worker])

    def finish_step(self) -> None:
        """After ``loss.backward()``: push what the hooks did not (the root bucket), release everything."""
        self._ready.update(self.schedule.grad_order)
        self._push_ready()
        self.link.end_step()

    # ----------------------------------------------------------------- hooks
    def _acquire(self, b: int, phase: int) -> None:
        if (b, phase) in self._acquired:   # the head's modules each ask; the first waits
            return
        self._acquired.add((b, phase))
        self._released.discard(b)
        slot = self._slot_of[(b, phase)]
        t0 = time.perf_counter()
        self.link.wait_params(slot)
        t1 = time.perf_counter()
        self.wait_s += t1 - t0
        self.peak_param_bytes = max(self.peak_param_bytes, self.resident_param_bytes())
        trace.interval(f"wait params b{b}" + (" (bwd)" if phase else ""), t0, t1, track="compute")

    def _release(self, b: int) -> None:
        self._released.add(b)
        self.buckets[b].free()
        self.link.released(b)

    def _grad_ready(self, b: int, index: int) -> None:
        seen = self._grads_seen[b]
        seen.add(index)
        if len(seen) == sum(p.requires_grad for p in self.buckets[b].params) and not self._pushed[b]:
            self._ready.add(b)
            self._push_ready()

    def _push_ready(self) -> None:
        """Push the complete buckets at the head of the gradient order, in that order."""
        order = self.schedule.grad_order
        while self._next_push < len(order) and order[self._next_push] in self._ready:
            b = order[self._next_push]
            self._next_push += 1
            if not self._pushed[b]:
                self._push(b)

    def _push(self, b: int) -> None:
        """Flatten bucket ``b``'s gradients (zeros for parameters that got none), hand them off, free ``b``."""
        bucket = self.buckets[b]
        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in bucket.params]
        # one parameter: its gradient is the flat vector (autograd made it for this parameter alone)
        flat = torch.cat(grads) if len(grads) > 1 else grads[0]
        del grads
        if bucket.numel > flat.numel():
            flat = torch.cat([flat, flat.new_zeros(bucket.numel - flat.numel())])
        for p in bucket.params:
            p.grad = None
        self._pushed[b] = True
        waited = self.link.push_grad(b, flat)   # may wait for earlier gradients to leave ([Note: gradients in flight])
        self.wait_s += waited or 0.0
        if b not in self._released:   # a root of embeddings left after the forward; its buffer may be refilled
            self._release(b)

    # --------------------------------------------------------------- queries
    def resident_param_bytes(self) -> int:
        return sum(b.flat.untyped_storage().nbytes() for b in self.buckets)
