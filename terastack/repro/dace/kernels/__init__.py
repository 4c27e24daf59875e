"""The NPBench-style kernel set, by name, in report order (grouped by domain)."""
from __future__ import annotations

from terastack.repro.dace.kernel import Kernel
from terastack.repro.dace.kernels import dl, linalg, misc, physics, stencils

KERNELS: dict[str, Kernel] = {k.name: k for mod in (linalg, stencils, dl, physics, misc) for k in mod.KERNELS}


def select(names: list[str] | None) -> list[Kernel]:
    """The kernels named (all when ``names`` is empty), with a clear error for an unknown one."""
    if not names:
        return list(KERNELS.values())
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise ValueError(f"unknown kernel(s) {unknown}; available: {', '.join(KERNELS)}")
    return [KERNELS[n] for n in names]
