"""The command-line flags of a job, derived from its sections' fields (see [Note: a job setting is one field]).

Every flag defaults to None, "not given", so that a ``--config`` file's value stands unless the flag is given
([Note: job config resolution]). A boolean setting gets ``--name`` and ``--no-name``; the alternatives of
:data:`~terastack.training.job.sections.ALTERNATIVES` are mutually exclusive.
"""
from __future__ import annotations

import argparse
import dataclasses

from terastack.training.job.sections import JobConfig, alternatives_of, sections_of
from terastack.training.job.setting import flat_name, hints, kinds

#: flags' ``dest`` start with this, then ``section.field``
_DEST = "job:"


def _type(hint):
    allowed = kinds(hint)
    if int in allowed and bool not in allowed and str not in allowed:
        return int
    if float in allowed and str not in allowed:
        return float
    return None  # a string: the section reads it (sizes, comma-separated lists)


def add_job_arguments(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = (), job: type = JobConfig,
                      only: tuple[str, ...] = ()) -> None:
    """One argument group per section of job class ``job`` (but those in ``skip``), one flag per setting (with
    ``only``: the settings it names as ``section.field``, for a command that takes a few of a job's settings)."""
    exclusive = {p: pair for pair in alternatives_of(job) for p in pair}
    for name, cls in sections_of(job).items():
        if name in skip:
            continue
        fields = [f for f in dataclasses.fields(cls) if f.metadata.get("flag", True)
                  and (not only or f"{name}.{f.name}" in only)]
        if not fields:
            continue
        group = parser.add_argument_group(f"{name}: {cls.__doc__.strip()}")
        mutex: dict[tuple, object] = {}  # one mutually exclusive group per pair of alternatives
        for f in fields:
            path = f"{name}.{f.name}"
            flat = flat_name(f)
            meta, hint = f.metadata, hints(cls)[f.name]
            names = [f"--{n.replace('_', '-')}" for n in (flat, *meta["aliases"])]
            where = group
            if path in exclusive:
                if exclusive[path] not in mutex:
                    mutex[exclusive[path]] = group.add_mutually_exclusive_group()
                where = mutex[exclusive[path]]
            shown = not (f.default is None or isinstance(f.default, bool) or f.default == "")
            help_text = meta["help"] + (f" (default {f.default})" if shown and "default" not in meta["help"]
                                        else "")
            kw = {"dest": _DEST + path, "default": None, "help": help_text.replace("%", "%%")}
            if bool in kinds(hint):
                where.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
                continue
            if tuple in kinds(hint) and str not in kinds(hint):
                kw["nargs"] = (len(f.default) if isinstance(f.default, tuple)
                               else len(meta["metavar"]) if isinstance(meta["metavar"], tuple) else "+")
            where.add_argument(*names, type=_type(hint), choices=meta["choices"],
                               metavar=None if meta["choices"] else meta["metavar"] or flat.upper(), **kw)


def job_flags(args: argparse.Namespace) -> dict:
    """The settings the command line gave, as ``{section.field: value}``."""
    return {k[len(_DEST):]: v for k, v in vars(args).items() if k.startswith(_DEST) and v is not None}
