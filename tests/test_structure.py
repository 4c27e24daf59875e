"""The package's shape, read from its source with ``ast``: no import cycles, no private names taken
across modules, and the dependency directions docs/design.md gives (engines never import each other;
the layers below them never import an engine)."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "terastack"
ENGINES = ("llm", "gnn", "disdp", "kernels")
# what each lower layer may not import: io is the bottom, tiers sits on io, plan serves every engine, training
# is what both language-model engines share
BELOW_ENGINES = ("io", "tiers", "plan", "training")
#: basenames that mean the same in every package that has one: its command line, its benchmark (a room's
#: `terastack bench` entry is `bench.py` or `bench/measure.py`)
SAME_MEANING = {"__init__.py", "__main__.py", "cli.py", "bench.py", "measure.py"}
MAX_LINES = 500
#: a function longer than this holds two ideas (docs/design.md)
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in the file, also inside functions."""
    out = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: None if is_package else -1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    out.append((f"{base}.{a.name}", None))
                elif base in known:
                    out.append((base, a.name))
    return [(m, taken) for m, taken in out if m != name]


@functools.lru_cache(maxsize=1)   # a second of parsing a call; the tests below only read what it returns
def graph() -> tuple[dict[str, set[str]], list[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    private = []
    for name, path in known.items():
        for target, taken in imports_of(name, path, known):
            # a package's __init__ re-exporting its own children is not a dependency of theirs on it
            if not (path.name == "__init__.py" and target.startswith(name + ".")):
                edges[name].add(target)
            if taken and taken.startswith("_") and not taken.startswith("__"):
                private.append(f"{name} takes {taken} from {target}")
    return edges, private


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules, or None. Iterative depth-first search (white/grey/black)."""
    colour = dict.fromkeys(edges, 0)
    for start in edges:
        if colour[start]:
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return path[path.index(child):] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(edges[child]))))
    return None


def part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle():
    edges, _ = graph()
    assert find_cycle(edges) is None


def test_no_private_name_crosses_a_module():
    _, private = graph()
    assert private == []


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_do_not_import_each_other(engine):
    edges, _ = graph()
    others = set(ENGINES) - {engine}
    crossing = sorted(f"{m} -> {t}" for m, ts in edges.items() if part(m) == engine for t in ts if part(t) in others)
    assert crossing == []


@pytest.mark.parametrize("layer", BELOW_ENGINES)
def test_layers_below_the_engines_import_none(layer):
    edges, _ = graph()
    upward = sorted(f"{m} -> {t}" for m, ts in edges.items() if part(m) == layer
                    for t in ts if part(t) in ENGINES + ("repro", "cli"))
    assert upward == []


#: the cost models answer "what fits and how fast" from numbers alone: no storage engine, store, job layer or engine
PLAN_MAY_NOT_IMPORT = ("io", "tiers", "training") + ENGINES + ("repro", "cli")
#: modules every layer may import (sizes, units, shared errors, dtype names, tier names); they import only each other
BOTTOM = ("constants", "units", "errors", "dtypes", "tier")


def test_plan_imports_no_storage_store_or_engine():
    edges, _ = graph()
    taken = sorted(f"{m} -> {t}" for m, ts in edges.items() if part(m) == "plan"
                   for t in ts if part(t) in PLAN_MAY_NOT_IMPORT)
    assert taken == []


def test_bottom_modules_import_only_each_other():
    edges, _ = graph()
    assert all(f"terastack.{b}" in edges for b in BOTTOM)
    upward = sorted(f"{m} -> {t}" for m, ts in edges.items() if m in {f"terastack.{b}" for b in BOTTOM}
                    for t in ts if part(t) not in BOTTOM)
    assert upward == []


def test_no_module_is_too_long_to_read():
    long = sorted(f"{p.relative_to(PACKAGE.parent)}: {n} lines" for p in PACKAGE.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert long == []


def test_no_function_is_too_long_to_read():
    long = sorted(f"{p.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {n} lines"
                  for p in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(p.read_text(), str(p)))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES)
    assert long == []


def test_no_basename_means_two_things():
    seen: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.name not in SAME_MEANING:
            seen.setdefault(p.name, []).append(str(p.relative_to(PACKAGE.parent)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_folder_is_named_like_build_output():
    # packaging tools and many linters skip folders named dist/ or build/ as generated
    assert sorted(str(p) for p in PACKAGE.rglob("*") if p.is_dir() and p.name in ("dist", "build")) == []


def test_every_benchmark_lives_in_its_rooms_bench_folder():
    """One layout for benchmark code: ``terastack bench NAME`` runs ``terastack.<room>.bench.<module>``."""
    from terastack.bench import BENCHMARKS

    misplaced = [(c.name, c.module) for c in BENCHMARKS
                 if not (c.module.count(".") == 3 and c.module.split(".")[2] == "bench")]
    assert misplaced == []
    # and no benchmark module sits beside a room's code under another name (the harness's runner of benchmark
    # modules is not one)
    stray = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*bench*.py")
                   if p.parent.name != "bench" and p.parent != PACKAGE and p.name != "__init__.py")
    assert stray == ["repro/bench_child.py"]
