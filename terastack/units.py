"""Byte sizes: parse "2GiB" / "512M" / 1024 and print them back."""
from __future__ import annotations

import re

from terastack.constants import round_up  # noqa: F401  (re-exported: callers import it from here)

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str, *, field: str = "size") -> int:
    """Bytes from an int or a string such as "2GiB", "1.5G", "4096". Raises ValueError naming `field`."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a size, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{field}: size must be >= 0, got {value!r}")
        return int(value)
    m = _PATTERN.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"{field}: cannot read {value!r} as a size (examples: 4096, 512MiB, 2GiB, 1.5GB)")
    return int(float(m.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

