"""Times every kernel in NumPy, DaCe and Numba, validated against NumPy. Runs inside the DaCe environment.

``python -m terastack.repro.dace.runner --preset smoke --out result.json [--kernels gemm,atax] ...``

[Note: timing protocol]
Per kernel, NumPy runs first on a copy of the inputs and its outputs are the
reference. Per framework:
1. first call, timed on its own: for DaCe it parses, optimizes, generates and
   compiles C++; for Numba it type-infers and compiles with LLVM. Reported as
   ``first_call_s`` (the compile cost is ``first_call_s - median``).
2. its outputs are validated against the reference (``np.allclose`` with the
   kernel's stated tolerances). A framework that fails validation is reported
   with its error and excluded from timing and from every speedup.
3. repeated calls, each on fresh copies of the arrays the kernel writes, made
   *before* the clock starts (read-only inputs are shared and checksummed:
   a framework that writes into one fails validation), until ``repeats`` runs or the time
   budget is used (at least ``min_repeats``). Median and a bootstrap 95%
   confidence interval of the median are reported, raw samples kept.
The JSON result is rewritten atomically after every framework, so a crash
(a segfault in generated code) leaves every finished measurement and names
the one in progress.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from importlib import metadata

import numpy as np

from terastack.atomic import atomic_write_json
from terastack.repro.dace import kernels as kernel_registry
from terastack.repro.dace.kernel import Kernel, Validation, fresh_args, readonly_checksums, validate
from terastack.repro.dace.stats import median_ci

FRAMEWORKS = ("numpy", "dace", "numba")

#: preset -> (repeats, min_repeats, per-framework timing budget in seconds)
TIMING = {"smoke": (5, 3, 3.0), "small": (10, 3, 10.0), "full": (10, 3, 25.0)}


def log(msg: str) -> None:
    print(f"[dace-suite] {msg}", file=sys.stderr, flush=True)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def configure_dace(build_dir: str) -> dict:
    """Build folder and BLAS choice for DaCe; returns what was chosen (for the report)."""
    import dace
    from dace.libraries.blas.environments import openblas

    dace.Config.set("default_build_folder", value=build_dir)
    # Library nodes (matmul, gemv) expand to OpenBLAS calls when its headers and LAPACKE are
    # installed (Debian: libopenblas-dev liblapacke-dev), otherwise to DaCe's own loops ("pure"),
    # which are far slower than NumPy's BLAS; the report says which one ran.
    blas = "OpenBLAS" if openblas.OpenBLAS.is_installed() else "pure"
    dace.Config.set("library", "blas", "default_implementation", value=blas)
    return {"blas_implementation": blas, "build_dir": build_dir,
            "cpu_args": dace.Config.get("compiler", "cpu", "args")}


def dace_callable(kernel: Kernel, auto_optimize: bool, inputs: dict):
    """The kernel's DaCe program, compiled, as a function taking the kernel's positional args.

    [Note: what is timed for DaCe]
    As NPBench does, the program is parsed to an SDFG, auto-optimized for the
    CPU (the paper's automatic optimizations), compiled, and the *compiled
    SDFG* is what gets called and timed. Calling the ``@dace.program`` object
    instead would add its per-call Python work (closure and type inspection,
    cache lookup, symbol inference): about 3.6 ms per call measured here on
    atax, more than the kernel itself at the smoke size. Symbols (array sizes)
    are inferred once from the inputs, whose shapes never change between runs.
    All of this happens inside the timed first call.
    """
    import dace
    from dace.data import create_datadescriptor
    from dace.frontend.python.parser import infer_symbols_from_datadescriptor
    from dace.transformation.auto.auto_optimize import auto_optimize as dace_auto_optimize

    prog = dace.program(kernel.dace())
    sdfg = prog.to_sdfg(simplify=True)
    symbols_given = set(kernel.extras.get("dace_symbols", ()))
    arrays = {n: v for n, v in inputs.items() if n not in symbols_given}
    symbols = {n: inputs[n] for n in symbols_given}
    symbols.update(infer_symbols_from_datadescriptor(sdfg, {k: create_datadescriptor(v) for k, v in arrays.items()}))
    if auto_optimize:
        sdfg = dace_auto_optimize(sdfg, dace.dtypes.DeviceType.CPU, symbols=symbols)
        sdfg.simplify()
    compiled = sdfg.compile()
    scalar = kernel.extras.get("scalar_return", False)

    def call(*args):
        ret = compiled(**{n: v for n, v in zip(kernel.args, args) if n not in symbols_given}, **symbols)
        # DaCe returns a scalar as a one-element array.
        return np.asarray(ret).reshape(()) if scalar else ret

    call.library = compiled.filename  # the shared library the C++ was compiled into (reported by the runner)
    return call


def build(kernel: Kernel, framework: str, inputs: dict, *, auto_optimize: bool):
    if framework == "numpy":
        return kernel.numpy
    if framework == "dace":
        if kernel.dace is None:
            raise NotImplementedError(f"{kernel.name} has no DaCe form")
        return dace_callable(kernel, auto_optimize, inputs)
    if framework == "numba":
        if kernel.numba is None:
            raise NotImplementedError(f"{kernel.name} has no Numba form")
        return kernel.numba()
    raise ValueError(f"framework: unknown {framework!r}; choose from {FRAMEWORKS}")


def time_calls(kernel: Kernel, fn, inputs: dict, *, repeats: int, min_repeats: int, budget_s: float) -> list[float]:
    """Wall times of repeated calls; inputs copied before each clock start (see [Note: timing protocol])."""
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats and (len(times) < min_repeats or spent < budget_s):
        args = fresh_args(kernel, inputs)
        start = time.perf_counter()
        kernel.call(fn, args)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
    return times


def measure_framework(kernel: Kernel, framework: str, inputs: dict, reference: list, checksums: dict, *,
                      repeats: int, min_repeats: int, budget_s: float, auto_optimize: bool) -> dict:
    rec: dict = {"framework": framework}
    try:
        start = time.perf_counter()
        fn = build(kernel, framework, inputs, auto_optimize=auto_optimize)
        outputs = kernel.call(fn, fresh_args(kernel, inputs))
        rec["first_call_s"] = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - every failure is reported, the suite goes on
        if framework == "dace" and auto_optimize:
            # The auto-optimizer is part of what is measured; when it fails, say so and measure
            # the program as the frontend produced it rather than reporting nothing.
            log(f"{kernel.name}: DaCe auto_optimize failed ({type(exc).__name__}); retrying without it")
            rec2 = measure_framework(kernel, framework, inputs, reference, checksums, repeats=repeats,
                                     min_repeats=min_repeats, budget_s=budget_s, auto_optimize=False)
            rec2["auto_optimize_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            return rec2
        rec.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000],
                   traceback=traceback.format_exc(limit=4)[-3000:])
        return rec
    rec["auto_optimize"] = auto_optimize if framework == "dace" else None
    if framework == "dace":
        # what the first call compiled: a shared library, built in that call (see [Note: timing protocol])
        rec["compiled_library"] = os.path.basename(getattr(fn, "library", "") or "")
    check = validate(reference, outputs, rtol=kernel.rtol, atol=kernel.atol)
    changed = [k for k, crc in readonly_checksums(kernel, inputs).items() if crc != checksums[k]]
    if changed:
        check = Validation(False, check.max_abs_err, check.max_rel_err,
                           f"wrote into its read-only input(s) {changed}")
    rec["validation"] = check.as_dict()
    if not check.ok:
        rec["status"] = "invalid"
        return rec
    times = time_calls(kernel, fn, inputs, repeats=repeats, min_repeats=min_repeats, budget_s=budget_s)
    rec.update(status="ok", times_s=times, **median_ci(times))
    rec["compile_s"] = max(rec["first_call_s"] - rec["median"], 0.0) if framework != "numpy" else 0.0
    return rec


def environment(dace_config: dict | None) -> dict:
    return {
        "python": platform.python_version(), "executable": sys.executable,
        "versions": {n: _version(n) for n in ("numpy", "dace", "numba", "llvmlite", "scipy", "networkx", "mpi4py")},
        "cores": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "numba_threads": _numba_threads(), "dace": dace_config,
    }


def _numba_threads():
    try:
        import numba

        return numba.config.NUMBA_NUM_THREADS
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


def run(args: argparse.Namespace) -> dict:
    selected = kernel_registry.select(args.kernels.split(",") if args.kernels else None)
    frameworks = args.frameworks.split(",")
    for f in frameworks:
        if f not in FRAMEWORKS:
            raise ValueError(f"--frameworks: unknown {f!r}; choose from {','.join(FRAMEWORKS)}")
    repeats, min_repeats, budget = TIMING[args.preset]
    repeats = args.repeats or repeats
    dace_config = configure_dace(args.build_dir) if "dace" in frameworks else None
    result = {"preset": args.preset, "frameworks": frameworks, "environment": environment(dace_config),
              "timing": {"repeats": repeats, "min_repeats": min_repeats, "budget_s": budget,
                         "confidence": 0.95, "statistic": "median, percentile bootstrap CI"},
              "kernels": {}, "in_progress": None}
    wall = time.perf_counter()
    for n, kernel in enumerate(selected, 1):
        entry = {"domain": kernel.domain, "definition": kernel.definition, "sizes": dict(kernel.sizes[args.preset]),
                 "rtol": kernel.rtol, "atol": kernel.atol, "tolerance_note": kernel.tolerance_note,
                 "dace_note": kernel.extras.get("dace_note"), "size_note": kernel.extras.get("size_note"),
                 "frameworks": {}}
        result["kernels"][kernel.name] = entry
        inputs = kernel.inputs(args.preset)
        result["in_progress"] = f"{kernel.name}/numpy"
        atomic_write_json(args.out, result)
        start = time.perf_counter()
        reference = kernel.call(kernel.numpy, fresh_args(kernel, inputs))
        reference_s = time.perf_counter() - start
        checksums = readonly_checksums(kernel, inputs)
        for framework in frameworks:
            result["in_progress"] = f"{kernel.name}/{framework}"
            atomic_write_json(args.out, result)
            rec = measure_framework(kernel, framework, inputs, reference, checksums, repeats=repeats,
                                    min_repeats=min_repeats, budget_s=budget, auto_optimize=not args.no_auto_optimize)
            if framework == "numpy":
                rec["first_call_s"] = reference_s
            entry["frameworks"][framework] = rec
            shown = (f"median {rec['median'] * 1e3:.2f} ms, first call {rec['first_call_s']:.2f} s"
                     if rec.get("status") == "ok" else f"{rec.get('status')}: {rec.get('error') or rec['validation']['detail']}")
            log(f"[{n}/{len(selected)}] {kernel.name:12s} {framework:6s} {shown[:300]}")
        result["in_progress"] = None
        atomic_write_json(args.out, result)
    result["wall_s"] = time.perf_counter() - wall
    atomic_write_json(args.out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m terastack.repro.dace.runner", description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=tuple(TIMING), default="smoke")
    p.add_argument("--kernels", default="", help="comma-separated kernel names (default: all)")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--repeats", type=int, default=0, help="timed runs per framework (default: by preset)")
    p.add_argument("--no-auto-optimize", action="store_true", help="run DaCe programs without its auto-optimizer")
    p.add_argument("--build-dir", default=os.path.join(os.getcwd(), ".dacecache"))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.repeats < 0:
        p.error("--repeats: must be >= 0")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
