"""A new trainer's store filled with its weights, one tensor at a time: a checkpoint's (through transformers' key
conversions), or a seeded random initialization; a LoRA model's adapters initialized beside its frozen base (a
checkpoint's, or a random one).

[Note: the fill within the budget]
The fill holds the weights being made (a random initialization's part, [Note: a random initialization in bounded
memory] in terastack.llm.model; a checkpoint's tensor read and made fp32), the copy one of them is converted to for
its record (the compute dtype, or NF4), and the writes on their way to the SSD. Those writes are bounded by
``room`` less the other two: on a CPU the device tier is host memory and holds nothing until the first step, so
the fill may hold what its budget gives it while the host ledger holds the state placed so far, and the process
stays within the two budgets. Without a bound (an accelerator, whose device memory the fill does not use) up to
:data:`~terastack.llm.engine.store_layout.FILL_IN_FLIGHT` bytes are in flight.
"""
from __future__ import annotations

import torch

from terastack.llm.engine import store_layout as layout
from terastack.llm.model import largest_init_part, random_init


def fill_store(runtime, model, units, tensors, *, seed: int, source, source_keys, lora, slicing,
               room: int | None = None) -> None:
    """Every weight into the store (``source``: a CheckpointReader with ``source_keys`` deciding which tensor
    each parameter is; None: random initialization), waiting until all of them have reached it. ``slicing``: the
    model's sliced parameters, split into their parts on the way in ([Note: vocabulary slices]); ``room``: the
    bytes the fill may hold at once ([Note: the fill within the budget])."""
    # held beside the writes: a random part in fp32 and one tensor's record of it; a checkpoint's tensor as read,
    # in fp32 and as its record
    held = 2 * largest_init_part(units) if source is None else 3 * 4 * max(t.numel for t in tensors.values())
    in_flight = initial_writes(runtime, room, held)
    if source is None:  # a LoRA model's random base is the plain model's from the same seed
        base = {n for n in tensors if lora is None or not lora.is_adapter(n)}
        for name, tensor in random_init(model, units, tensors, seed, wanted=base):
            layout.put_initial(runtime, name, tensor, in_flight)
            del tensor  # let go before the next one is made
        fill_adapters(runtime, model, units, tensors, seed=seed, lora=lora, in_flight=in_flight)
    else:
        fill_from_checkpoint(runtime, model, units, tensors, seed=seed, source=source, source_keys=source_keys,
                             lora=lora, in_flight=in_flight, slicing=slicing)
    in_flight.finish()


def initial_writes(runtime, room: int | None, held: int) -> layout.InitialWrites:
    """The fill's writes in flight, bounded by ``room`` less the ``held`` bytes beside them ([Note: the fill within
    the budget]; ``room`` None: :data:`~terastack.llm.engine.store_layout.FILL_IN_FLIGHT`)."""
    limit = layout.FILL_IN_FLIGHT if room is None else max(0, min(layout.FILL_IN_FLIGHT, room - held))
    return layout.InitialWrites(runtime, limit)


def fill_from_checkpoint(runtime, model, units, tensors, *, seed: int, source, source_keys, lora,
                         in_flight: layout.InitialWrites, slicing) -> None:
    """The weights from the checkpoint, through transformers' key conversions; a LoRA model's frozen base
    alike (under peft's names), its adapters initialized (peft's initialization or ``lora.init_from``)."""
    filled = set()
    for name, tensor in source_keys.tensors(source.get):
        name = lora.peft_name(name) if lora is not None else name
        for part, rows in slicing.split(name, tensor):
            filled.add(part)
            layout.put_initial(runtime, part, rows.to(torch.float32), in_flight)
    source.close()
    ordered = sorted(tensors, key=lambda n: tensors[n].index)
    missing = [n for n in ordered if n not in filled and not (lora is not None and lora.is_adapter(n))]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"checkpoint {source.path} has no tensor for parameter {missing[0]!r}{more}")
    fill_adapters(runtime, model, units, tensors, seed=seed, lora=lora, in_flight=in_flight)


def fill_adapters(runtime, model, units, tensors, *, seed: int, lora, in_flight: layout.InitialWrites) -> None:
    """A LoRA model's adapters: peft's initialization, or ``lora.init_from``'s."""
    adapters = [n for n in sorted(tensors, key=lambda n: tensors[n].index) if lora is not None and lora.is_adapter(n)]
    if adapters:
        for name, tensor in lora.initial_adapter(model, units, tensors, adapters, seed):
            layout.put_initial(runtime, name, tensor, in_flight)
