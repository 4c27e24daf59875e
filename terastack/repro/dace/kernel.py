"""What one NPBench-style kernel is: its definition, inputs, outputs, sizes and tolerances.

This module and the kernel modules import only NumPy at module level: they are
loaded both by the harness (its own environment) and by the runner inside the
separate DaCe environment (see :mod:`terastack.repro.dace.env`). DaCe and Numba
are imported only inside the factories that build a kernel's compiled form.

[Note: one algorithm, three frameworks]
Each kernel is written once from its mathematical definition in plain NumPy.
Where that NumPy code is also valid DaCe, the DaCe form is the very same
function with its argument types declared (:func:`annotated`) — gemm, atax,
bicg, mvt, gesummv, k2mm, the three stencils, softmax and nbody. Otherwise
(conv2d, azimint, spmv, crc16) the DaCe form says the same thing with
``dace.map`` or explicit loops, the paper's "HPC extensions", and its module
says why. The Numba form is the idiomatic one for Numba: the NumPy function
itself under ``@njit`` where Numba compiles it well (the BLAS kernels),
explicit loops with ``prange`` otherwise. All three compute the same
algorithm (same operation count), so a speedup compares compilers and
runtimes, not algorithms.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import types
import zlib

import numpy as np

PRESETS = ("smoke", "small", "full")


@dataclass(frozen=True, kw_only=True, slots=True)
class Kernel:
    name: str
    domain: str
    #: the mathematical definition, one line, shown in the report
    definition: str
    #: positional argument names, in call order (identical for all frameworks)
    args: tuple[str, ...]
    #: arguments the kernel writes in place (validated after the call)
    outputs: tuple[str, ...] = ()
    #: number of arrays the kernel returns (validated too)
    returns: int = 0
    #: preset -> size parameters passed to ``init``; NumPy takes ~10/100/1000 ms here
    sizes: Mapping[str, Mapping[str, int]]
    #: size parameters -> {argument name: value}; deterministic (seeded)
    init: Callable[..., dict]
    numpy: Callable
    #: returns the DaCe-annotated Python function (wrapped by ``dace.program`` in the runner)
    dace: Callable[[], Callable] | None = None
    #: returns the Numba-compiled function
    numba: Callable[[], Callable] | None = None
    #: ``np.allclose(got, numpy_result, rtol, atol)``
    rtol: float = 1e-10
    atol: float = 1e-12
    #: why the tolerance is what it is (reassociation, fast-math, float accumulation order)
    tolerance_note: str = "float64, only summation order differs"
    extras: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.outputs and not self.returns:
            raise ValueError(f"kernel {self.name}: outputs/returns: a kernel must produce something to validate")
        for o in self.outputs:
            if o not in self.args:
                raise ValueError(f"kernel {self.name}: outputs: {o!r} is not one of its args {self.args}")
        for preset in PRESETS:
            if preset not in self.sizes:
                raise ValueError(f"kernel {self.name}: sizes: preset {preset!r} missing")
        if self.rtol < 0 or self.atol < 0:
            raise ValueError(f"kernel {self.name}: rtol/atol: must be >= 0")

    def inputs(self, preset: str) -> dict:
        if preset not in self.sizes:
            raise ValueError(f"kernel {self.name}: preset {preset!r} unknown; choose one of {list(self.sizes)}")
        return self.init(**self.sizes[preset])

    def call(self, fn: Callable, inputs: Mapping) -> list[np.ndarray]:
        """Call ``fn`` on ``inputs`` (already copied) and collect every output for validation."""
        ret = fn(*[inputs[a] for a in self.args])
        return collect_outputs(self, inputs, ret)


def fresh_args(kernel: Kernel, inputs: Mapping) -> dict:
    """Arguments for one call: fresh copies of the arrays the kernel writes, the read-only ones shared.

    Done outside the timed region. Read-only inputs are not copied (a 1 GB matrix copy per
    run would dominate the memory-bound kernels); :func:`readonly_checksums` checks that no
    framework writes into them.
    """
    return {k: (v.copy() if k in kernel.outputs and isinstance(v, np.ndarray) else v) for k, v in inputs.items()}


def readonly_checksums(kernel: Kernel, inputs: Mapping) -> dict[str, int]:
    """CRC32 of every read-only array argument (without copying it)."""
    out = {}
    for k, v in inputs.items():
        if k not in kernel.outputs and isinstance(v, np.ndarray):
            out[k] = zlib.crc32(memoryview(np.ascontiguousarray(v)).cast("B"))
    return out


def collect_outputs(kernel: Kernel, inputs: Mapping, ret) -> list[np.ndarray]:
    outs = [np.asarray(inputs[o]) for o in kernel.outputs]
    if kernel.returns == 1:
        outs.append(np.asarray(ret))
    elif kernel.returns > 1:
        if not isinstance(ret, (tuple, list)) or len(ret) != kernel.returns:
            raise ValueError(f"kernel {kernel.name}: expected {kernel.returns} return values, got {type(ret).__name__}")
        outs.extend(np.asarray(r) for r in ret)
    return outs


@dataclass(frozen=True, slots=True)
class Validation:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    detail: str

    def as_dict(self) -> dict:
        return {"ok": self.ok, "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "detail": self.detail}


def validate(reference: list[np.ndarray], got: list[np.ndarray], *, rtol: float, atol: float) -> Validation:
    """``np.allclose`` per output, plus shape, dtype kind and NaN checks; says which output failed and by how much."""
    if len(reference) != len(got):
        return Validation(False, float("inf"), float("inf"), f"{len(got)} outputs, expected {len(reference)}")
    worst_abs = worst_rel = 0.0
    for i, (ref, out) in enumerate(zip(reference, got)):
        out = np.asarray(out)
        if ref.shape != out.shape:
            return Validation(False, float("inf"), float("inf"), f"output {i}: shape {out.shape}, expected {ref.shape}")
        if ref.size == 0:
            continue
        if np.issubdtype(ref.dtype, np.integer) and not np.array_equal(ref, out):
            bad = int(np.count_nonzero(ref != out))
            return Validation(False, float("inf"), float("inf"), f"output {i}: {bad} integer elements differ")
        ref_f = ref.astype(np.float64, copy=False)
        out_f = out.astype(np.float64, copy=False)
        if np.isnan(out_f).any() != np.isnan(ref_f).any() or not np.array_equal(np.isnan(out_f), np.isnan(ref_f)):
            return Validation(False, float("nan"), float("nan"), f"output {i}: NaN where the reference has none")
        diff = np.abs(out_f - ref_f)
        diff = np.where(np.isnan(diff), 0.0, diff)
        abs_err = float(diff.max())
        rel_err = float((diff / np.maximum(np.abs(ref_f), np.finfo(np.float64).tiny)).max())
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if not np.allclose(out_f, ref_f, rtol=rtol, atol=atol, equal_nan=True):
            idx = np.unravel_index(int(np.argmax(diff - rtol * np.abs(ref_f))), diff.shape)
            return Validation(False, abs_err, rel_err,
                              f"output {i}: not allclose(rtol={rtol:g}, atol={atol:g}); worst at {tuple(map(int, idx))}: "
                              f"got {out_f[idx]!r}, expected {ref_f[idx]!r}")
    return Validation(True, worst_abs, worst_rel, f"allclose(rtol={rtol:g}, atol={atol:g})")


def annotated(fn: Callable, **annotations) -> Callable:
    """A copy of ``fn`` — the same code object — carrying DaCe type annotations.

    Where a kernel's NumPy code is also valid DaCe, its DaCe form is exactly this:
    the very function NumPy runs, with its argument types (and symbolic sizes) declared.
    """
    f = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    f.__annotations__ = dict(annotations)
    f.__qualname__, f.__module__ = fn.__qualname__, fn.__module__
    return f


def njit(fn: Callable, **options) -> Callable:
    """``fn`` compiled by Numba in nopython mode (compilation happens at the first call)."""
    import numba

    return numba.njit(cache=False, **options)(fn)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
