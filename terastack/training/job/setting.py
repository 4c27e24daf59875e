"""One job setting: a dataclass field that carries its help text and its flat name, and how its values read.

[Note: a job setting is one field]
A section of the job (:mod:`terastack.training.job.sections`) is a ``@dataclass(kw_only=True, slots=True)``
whose fields are made by :func:`setting`. Everything else about a setting follows from that one field:

    file key        ``section.field`` in a sectioned file, or the field's flat name at the top level
    flag            ``--flat-name`` (and the field's aliases), in an argument group per section
    override        ``section.field=VALUE`` or ``flat_name=VALUE`` after the flags
    type            the field's annotation: values are read as it says (:func:`coerce`), once, in the section's
                    ``__post_init__``, which then checks their ranges and raises :class:`SettingError`

The flat name is the field's name unless ``flat=`` gives another (``model.path`` is ``model``, ``--model``);
flat names are unique over the whole job, so a flat key or a flag names exactly one field.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import MISSING


class SettingError(ValueError):
    """A setting's value is refused; ``path`` names it as ``section.field``."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


#: ``setting(path=...)``: a file system path, comma-separated paths (``"paths"``), or a path or a name
#: (``"path_or_name"``: a model or data set may be a built-in name or a Hub id; it is a path when it exists)
PATH_KINDS = ("path", "paths", "path_or_name")


def setting(default=MISSING, *, help: str, flat: str | None = None, aliases: tuple[str, ...] = (),
            choices: tuple | None = None, metavar: str | None = None, flag: bool = True, path: str | None = None,
            writes: bool = False):
    """A job setting (see [Note: a job setting is one field]). ``flat``: its name at a file's top level, as an
    override and as a flag (default: the field's name); ``aliases``: more flag names; ``flag=False``: no flag;
    ``path``: one of :data:`PATH_KINDS` when the value names files (a saved job stores it absolute); ``writes``:
    the job writes there (checked before it starts: [Note: room to write] in terastack.disk_room)."""
    if path is not None and path not in PATH_KINDS:
        raise TypeError(f"setting(path=...): one of {PATH_KINDS}, got {path!r}")
    if writes and path is None:
        raise TypeError("setting(writes=True) names a path: give path=...")
    meta = {"help": help, "flat": flat, "aliases": tuple(aliases), "choices": choices, "metavar": metavar,
            "flag": flag, "path": path, "writes": writes}
    if isinstance(default, (list, dict, set)):
        raise TypeError("a setting's default is immutable (a tuple, not a list)")
    return dataclasses.field(default=default, metadata=meta)


def flat_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flat") or f.name


# ------------------------------------------------------------------ reading values
_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", tuple: "a list",
               type(None): "null"}
_HINTS: dict[type, dict[str, object]] = {}


def hints(cls) -> dict[str, object]:
    """The evaluated annotations of a section class (cached: they are read on every construction)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def kinds(hint) -> tuple:
    """The plain types a hint allows: ``int | None`` -> (int, NoneType); ``tuple[float, float]`` -> (tuple,)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(k for a in typing.get_args(hint) for k in kinds(a))
    origin = typing.get_origin(hint)
    return (origin,) if origin is not None else (hint,)


def _element(hint):
    """The element type of the tuple in a hint (``tuple[float, float]``, ``str | tuple[str, ...]``), or None."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    for a in typing.get_args(hint) if union else (hint,):
        if typing.get_origin(a) is tuple:
            args = [x for x in typing.get_args(a) if x is not Ellipsis]
            return args[0] if args else None
    return None


def coerce(path: str, value, hint):
    """``value`` read as ``hint`` says: a YAML file's ``1e-5`` (a string in YAML 1.1) as a number, ``2.0`` as an
    integer, a list as a tuple; anything else refused with :class:`SettingError` naming ``path``."""
    allowed = kinds(hint)
    if value is None:
        if type(None) in allowed:
            return None
        raise SettingError(path, f"must be {' or '.join(_KIND_NAMES[k] for k in allowed)}, got null")
    if isinstance(value, bool):
        if bool in allowed:
            return value
    elif isinstance(value, int) and int in allowed:
        return value
    elif isinstance(value, (int, float)) and float in allowed:
        return float(value)
    elif isinstance(value, float) and int in allowed and value.is_integer():
        return int(value)
    elif isinstance(value, str):
        if str in allowed:
            return value
        if float in allowed:
            try:
                return float(value)
            except ValueError:
                pass
    elif isinstance(value, (list, tuple)) and tuple in allowed:
        element = _element(hint)
        return tuple(value if element is None else (coerce(f"{path}[{i}]", v, element) for i, v in enumerate(value)))
    names = [_KIND_NAMES[k] for k in allowed if k is not type(None)]
    raise SettingError(path, f"must be {' or '.join(names)}, got {value!r}")


def read_fields(section) -> None:
    """Every field of ``section`` read as its annotation says (the first thing a section's ``__post_init__``
    does)."""
    for name, hint in hints(type(section)).items():
        setattr(section, name, coerce(f"{section.SECTION}.{name}", getattr(section, name), hint))


def at_least(section, name: str, low) -> None:
    value = getattr(section, name)
    if value is not None and not value >= low:
        raise SettingError(f"{section.SECTION}.{name}", f"must be >= {low}, got {value}")


def one_of(section, name: str, allowed: tuple) -> None:
    value = getattr(section, name)
    if value not in allowed:
        raise SettingError(f"{section.SECTION}.{name}", f"must be one of {', '.join(map(str, allowed))}; "
                           f"got {value!r}")
