"""Runs one benchmark module at a preset in its own process and writes a status-tagged JSON.

``python -m terastack.repro.bench_child MODULE PRESET OUT.json [ARGS_JSON]``

ARGS_JSON, when given, is a JSON list of the benchmark's arguments, used instead of
``MODULE.PRESETS[PRESET]`` (the harness's own presets, see suites.HARNESS_ARGS).

The harness starts one of these per benchmark so that a crash, a leak or a
hang in one engine cannot take the others with it. The outcome is always
one of:
- ``ok``: ``result`` holds ``measure(args)`` plus the environment stamp;
- ``missing``: the module does not exist in this installation;
- ``dependency-missing``: importing or running it needed a module that is
  not installed (named in ``missing_module``);
- ``no-preset``: the module has no ``PRESETS[preset]``;
- ``error``: anything else, with the exception and a traceback tail.
"""
from __future__ import annotations

import argparse
import importlib
import json
import importlib.util
import sys
import time
import traceback

from terastack.atomic import atomic_write_json

def module_present(name: str) -> bool:
    """Whether ``name`` can be imported here (False, not an error, when a parent package is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


EXIT_CODES = {"ok": 0, "error": 1, "missing": 3, "dependency-missing": 4, "no-preset": 5}


def run_module(module_name: str, preset: str, argv: list[str] | None = None) -> dict:
    started = time.perf_counter()
    try:
        # inside the try: finding a submodule imports its parents, and a parent that fails to import is an error
        # to report with its traceback, not a missing module
        if not module_present(module_name):
            return {"status": "missing", "reason": f"module {module_name} is not part of this installation"}
        module = importlib.import_module(module_name)
        presets = getattr(module, "PRESETS", None)
        if argv is None and (not isinstance(presets, dict) or preset not in presets):
            have = sorted(presets) if isinstance(presets, dict) else "none"
            return {"status": "no-preset", "reason": f"{module_name}.PRESETS has no {preset!r} (has: {have})"}
        from terastack.bench import add_common_arguments

        parser = argparse.ArgumentParser(prog=f"terastack bench ({module_name})")
        add_common_arguments(parser)
        module.add_arguments(parser)
        where = f"{module_name}.PRESETS[{preset!r}]" if argv is None else f"the harness's arguments for {preset!r}"
        argv = [str(a) for a in (presets[preset] if argv is None else argv)]
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            return {"status": "error", "reason": f"{where} = {argv} does not parse"}
        result = module.measure(args)
        if not isinstance(result, dict):
            return {"status": "error", "reason": f"{module_name}.measure returned {type(result).__name__}, not a dict"}
        from terastack.io.backend import backend_record
        from terastack.reporting import environment

        result.setdefault("environment", environment(io_backend=backend_record()))
        return {"status": "ok", "result": result, "argv": argv, "wall_s": time.perf_counter() - started,
                "headline": list(getattr(module, "HEADLINE", []) or [])}
    except ModuleNotFoundError as exc:
        return {"status": "dependency-missing", "missing_module": exc.name,
                "reason": f"needs the module {exc.name!r}, which is not installed ({exc})",
                "traceback": traceback.format_exc(limit=6)[-3000:]}
    except Exception as exc:  # noqa: BLE001 - every failure becomes a reported status
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000],
                "traceback": traceback.format_exc(limit=8)[-4000:], "wall_s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (3, 4):
        print("usage: python -m terastack.repro.bench_child MODULE PRESET OUT.json [ARGS_JSON]", file=sys.stderr)
        return 2
    module_name, preset, out = argv[:3]
    args = json.loads(argv[3]) if len(argv) == 4 else None
    outcome = run_module(module_name, preset, args)
    outcome.update(module=module_name, preset=preset)
    atomic_write_json(out, outcome)
    return EXIT_CODES.get(outcome["status"], 1)


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(main())   # [Note: a process leaves without teardown]
