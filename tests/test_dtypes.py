"""The one dtype-name table (terastack.dtypes) against torch's and safetensors' own spellings, and no second
table of dtype names anywhere in the package."""
import ast
import json
import struct
from pathlib import Path

import pytest
import torch

from terastack.dtypes import (COMPUTE_DTYPES, DTYPES, SAFETENSORS_DTYPES, SAFETENSORS_NAMES, WEIGHT_DTYPES,
                              dtype_name, to_dtype)

PACKAGE = Path(__file__).resolve().parent.parent / "terastack"


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_names_are_torchs_own(name):
    dtype = DTYPES[name]
    assert str(dtype) == f"torch.{name}"  # the reference: how torch prints it
    assert dtype_name(dtype) == name and to_dtype(name) is dtype


def test_safetensors_names_are_the_formats_own(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    for dtype, st_name in SAFETENSORS_NAMES.items():
        path = tmp_path / f"{st_name}.safetensors"
        st.save_file({"x": torch.zeros(2, dtype=dtype)}, str(path))
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        assert json.loads(raw[8:8 + n])["x"]["dtype"] == st_name
        assert SAFETENSORS_DTYPES[st_name] is dtype


def test_narrowed_names_and_bad_names_are_refused_naming_the_field():
    assert set(COMPUTE_DTYPES) <= set(WEIGHT_DTYPES) <= set(DTYPES)
    assert to_dtype("bfloat16", allowed=COMPUTE_DTYPES) is torch.bfloat16
    with pytest.raises(ValueError, match=r"^dtype: must be one of float32, bfloat16; got 'float16'"):
        to_dtype("float16", allowed=COMPUTE_DTYPES)
    # a name read from a file never reaches getattr(torch, ...): torch attributes that are not dtypes are refused
    for bad in ("Tensor", "load", "float", "torch.float32", ""):
        with pytest.raises(ValueError, match="^entry dtype: must be one of"):
            to_dtype(bad, field="entry dtype")


def _dtype_tables(tree: ast.AST) -> list[int]:
    """Lines of dict literals mapping string keys to torch.<float dtype> values."""
    floats = {"float32", "float16", "bfloat16", "float64"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and len(node.keys) >= 2:
            str_keys = any(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys)
            torch_values = sum(isinstance(v, ast.Attribute) and v.attr in floats and isinstance(v.value, ast.Name)
                               and v.value.id == "torch" for v in node.values)
            if str_keys and torch_values >= 2:
                lines.append(node.lineno)
    return lines


def test_no_second_table_of_dtype_names():
    planted = ast.parse('T = {"float32": torch.float32, "bfloat16": torch.bfloat16}')
    assert _dtype_tables(planted) == [1]  # the finder finds one
    found = {str(p.relative_to(PACKAGE.parent)): lines for p in PACKAGE.rglob("*.py")
             if p.name != "dtypes.py" and (lines := _dtype_tables(ast.parse(p.read_text())))}
    assert found == {}
