"""What an export wrote, read back for the tests that compare trained weights."""
from __future__ import annotations


def exported_weights(export) -> dict:
    """Every tensor of the ``*.safetensors`` files in the directory ``export`` (a pathlib.Path), by name."""
    from safetensors.torch import load_file

    out = {}
    for f in sorted(export.glob("*.safetensors")):
        out.update(load_file(str(f)))
    assert out, f"no weights in {export}"
    return out
