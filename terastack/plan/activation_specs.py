"""What a unit does with the activations its autograd graph saves, as the planner and the engine both read it.

[Note: activation specs]
One spec per activation policy: keep them on the device, swap them to host
memory or to the SSD, or keep only the unit's inputs and recompute the rest in
backward. A spec gives the planner a unit's bytes in each place between its
forward and its backward (:meth:`ActivationSpec.device_bytes`,
:meth:`~ActivationSpec.host_bytes`, :meth:`~ActivationSpec.ssd_bytes`), the
bytes on their way out and back (:meth:`~ActivationSpec.in_flight_bytes`) and
the compute it adds (:meth:`~ActivationSpec.recompute_s`); it tells the engine
whether backward recomputes (``recomputes``) and where saved storages rest
(``rests_in``). The runtime side is one class per spec in
``terastack.llm.engine.unit_policies``, found by the spec.

:data:`AUTO` is not a policy a unit runs: it asks the planner to search the
layers' policies (its [Note: choosing the activation policy]): the policies
with a ``search_rank`` take the first layers of the forward in that order, the
:data:`DEFAULT` policy the rest. A new policy is a subclass here, registered
with :func:`register_activation`, and its runtime class there.
"""
from __future__ import annotations

from typing import ClassVar

from terastack.constants import BLOCK
from terastack.tier import Tier

#: the planner chooses each decoder layer's policy
AUTO = "auto"


class ActivationSpec:
    """One activation policy: see [Note: activation specs]. ``unit`` arguments are profile units (``act_bytes``,
    ``boundary_bytes``, ``act_tensors``)."""

    name: ClassVar[str] = ""
    #: where the saved storages rest between forward and backward (recompute: only the inputs, on the device)
    rests_in: ClassVar[Tier] = Tier.DEVICE
    #: backward runs the unit's forward again from its kept inputs
    recomputes: ClassVar[bool] = False
    #: place in the automatic search: lower ranks take earlier layers; None: never searched (the default fills)
    search_rank: ClassVar[int | None] = None

    def __repr__(self) -> str:
        return f"<activation policy {self.name}>"

    def device_bytes(self, unit) -> int:
        """Bytes held on the device from the unit's forward to its backward."""
        return unit.act_bytes if self.rests_in is Tier.DEVICE else 0

    def host_bytes(self, unit) -> int:
        """Bytes held in host memory from the unit's forward to its backward."""
        return unit.act_bytes if self.rests_in is Tier.HOST else 0

    def ssd_bytes(self, unit) -> int:
        """Bytes written to the SSD in the unit's forward and read back in its backward."""
        return unit.act_bytes if self.rests_in is Tier.SSD else 0

    def in_flight_bytes(self, unit) -> int:
        """Device bytes of the unit's activations on their way out or back (the device ledger holds two units')."""
        return 0

    def recompute_s(self, fwd_s: float) -> float:
        """Compute seconds the policy adds to backward (``fwd_s``: the unit's forward)."""
        return 0.0


class KeepSpec(ActivationSpec):
    name = "keep"


class HostSpec(ActivationSpec):
    name = "host"
    rests_in = Tier.HOST
    search_rank = 1

    def host_bytes(self, unit) -> int:
        # each saved storage a host buffer padded for direct I/O, as a store record
        return unit.act_bytes + unit.act_tensors * BLOCK

    def in_flight_bytes(self, unit) -> int:
        return unit.act_bytes


class SsdSpec(ActivationSpec):
    name = "ssd"
    rests_in = Tier.SSD
    search_rank = 0  # the first layers: their activations have the longest time to travel and return

    def in_flight_bytes(self, unit) -> int:
        return unit.act_bytes + unit.act_tensors * BLOCK  # each saved storage a padded store record


class RecomputeSpec(ActivationSpec):
    name = "recompute"
    recomputes = True
    search_rank = 2

    def device_bytes(self, unit) -> int:
        return unit.boundary_bytes

    def recompute_s(self, fwd_s: float) -> float:
        return fwd_s


#: name -> spec of every activation policy, in the order summaries list them
ACTIVATIONS: dict[str, ActivationSpec] = {}


def register_activation(spec: ActivationSpec) -> ActivationSpec:
    if not spec.name or spec.name in ACTIVATIONS or spec.name == AUTO:
        raise ValueError(f"activation spec {spec!r}: its name must be new, not empty and not {AUTO!r}")
    ACTIVATIONS[spec.name] = spec
    return spec


KEEP = register_activation(KeepSpec())
HOST = register_activation(HostSpec())
SSD = register_activation(SsdSpec())
RECOMPUTE = register_activation(RecomputeSpec())
#: what a unit does when nothing else is planned for it (units outside the decoder stack; layers no search picks)
DEFAULT = KEEP


def activation_spec(name: str) -> ActivationSpec:
    """The spec registered as ``name``; ValueError naming the field ``policy`` otherwise."""
    spec = ACTIVATIONS.get(name)
    if spec is None:
        raise ValueError(f"policy: {name!r} is not one of {', '.join(ACTIVATIONS)}")
    return spec


def searched() -> list[ActivationSpec]:
    """The policies the automatic search places, in the order they take the forward's layers."""
    return sorted((s for s in ACTIVATIONS.values() if s.search_rank is not None), key=lambda s: s.search_rank)


def layer_counts(kinds: int, left: int, counts: list[int]):
    """Every tuple of ``kinds`` layer counts from ``counts`` that add up to at most ``left`` (the first kind's
    count varying slowest)."""
    if not kinds:
        yield ()
        return
    for c in counts:
        if c <= left:
            for rest in layer_counts(kinds - 1, left - c, counts):
                yield (c, *rest)
