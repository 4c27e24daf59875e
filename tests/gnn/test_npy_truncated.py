"""`gnn import` of a truncated ``.npy`` says it is truncated (expected vs actual bytes), naming the file."""
from __future__ import annotations

import numpy as np
import pytest

from terastack.cli import main
from terastack.gnn.storage.dataset import DatasetError
from terastack.gnn.importer import load_npy


@pytest.fixture
def edges(tmp_path):
    path = tmp_path / "edge_index.npy"
    np.save(path, np.arange(1000, dtype=np.int64).reshape(2, 500))
    return path, path.read_bytes()


def test_truncated_data_says_expected_and_actual_bytes(edges):
    path, full = edges
    path.write_bytes(full[:-8])
    with pytest.raises(DatasetError) as info:
        load_npy(path, "edge_index")
    msg = str(info.value)
    assert msg == (f"{path}: edge_index is truncated: its header says (2, 500) int64 ({len(full)} bytes with the "
                   f"header), the file has {len(full) - 8} bytes")
    assert "pickl" not in msg


@pytest.mark.parametrize("keep, where", [(100, "inside its .npy header"), (5, "too short for a .npy header"),
                                         (0, "too short for a .npy header")])
def test_truncated_header_says_truncated(edges, keep, where):
    path, full = edges
    path.write_bytes(full[:keep])
    with pytest.raises(DatasetError, match=f"^{path}: edge_index is truncated: {keep} bytes, {where}$"):
        load_npy(path, "edge_index")


def test_gnn_import_of_truncated_file_is_one_line(tmp_path, edges, capsys):
    path, full = edges
    path.write_bytes(full[: len(full) // 2])
    np.save(tmp_path / "node_feat.npy", np.zeros((500, 4), np.float32))
    np.save(tmp_path / "node_label.npy", np.zeros(500, np.int64))
    (tmp_path / "split").mkdir()
    for name in ("train", "valid", "test"):
        np.save(tmp_path / "split" / f"{name}.npy", np.arange(10))
    assert main(["gnn", "import", "--ogb-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}: edge_index is truncated" in err and "pickl" not in err
