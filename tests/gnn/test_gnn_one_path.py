"""One GNN path for both graph kinds, read from the source: storage imports nothing from sampling (placement sits
above both), no heterogeneous twin beside a homogeneous module, one placement call in the benchmarks, and the
graph kind read only where a dataset is opened."""
from __future__ import annotations

import ast
from pathlib import Path

GNN = Path(__file__).resolve().parents[2] / "terastack" / "gnn"


def imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_storage_imports_nothing_from_sampling():
    taken = sorted(f"{p.name}: {m}" for p in (GNN / "storage").glob("*.py") for m in imported(p)
                   if m.startswith("terastack.gnn.sampling"))
    assert taken == []


def test_no_heterogeneous_twin_beside_a_homogeneous_module():
    twins = sorted(str(p.relative_to(GNN)) for p in GNN.rglob("hetero_*.py")
                   if (p.parent / p.name.removeprefix("hetero_")).exists())
    assert twins == []


def test_the_benchmarks_place_through_the_one_placement_call():
    text = "\n".join(p.read_text() for p in (GNN / "bench").glob("*.py"))
    assert "UnifiedCache(" not in text and "share_budget(" not in text and "Placement(" in text


def test_the_graph_kind_is_read_where_a_dataset_is_opened():
    """Only the manifest reader compares formats; nothing else asks a directory which kind it holds."""
    readers = sorted(str(p.relative_to(GNN)) for p in GNN.rglob("*.py")
                     if "HETERO_FORMAT" in p.read_text() and p.name != "manifest.py")
    assert readers == [] and "is_hetero_dataset" not in "".join(p.read_text() for p in GNN.rglob("*.py"))
