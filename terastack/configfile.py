"""Config dataclasses from plain data: a mapping (JSON, the command line) or a table of a TOML file.

Every engine's config loads the same way, so the same mistakes read the same: an unknown field is named
together with the known ones, and a TOML file that does not parse is named with the parser's reason.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib


def config_from_dict(cls, data: dict, *, what: str):
    """``cls(**data)`` after refusing fields ``cls`` does not have (ValueError naming them and the known ones)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} fields: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return cls(**data)


def read_toml_table(path: str | os.PathLike, table: str) -> dict:
    """The ``[table]`` of a TOML file, or the whole file when it has no such table."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None
    return data.get(table, data)
