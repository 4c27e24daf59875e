"""Subcommand tables: ``terastack``, ``terastack plan`` and ``terastack bench`` each list (name, module, help)
and add one sub-parser per installed module. Modules are imported only to add their arguments; a module
that is not installed (an engine's optional extra missing) is simply absent from ``--help``.

A subcommand module provides ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Callable, Sequence


def available(module: str) -> bool:
    """Whether ``module`` is installed."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def add_subcommands(sub, table: Sequence[tuple[str, str, str]], *, module_key: str,
                    extra: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """One sub-parser per installed module of ``table``; the chosen module's name is stored in ``module_key``
    of the parsed arguments (and the sub-parser itself in ``_parser``, for errors that print its usage)."""
    for name, module, help_text in table:
        if not available(module):
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(**{module_key: module, "_parser": p})
        if extra is not None:
            extra(p)
        importlib.import_module(module).add_arguments(p)
