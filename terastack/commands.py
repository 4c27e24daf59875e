"""Subcommand tables: ``terastack``, ``terastack plan`` and ``terastack bench`` each list their subcommands
(:class:`Command`: name, module, one-line help, the optional packages it needs) and add one sub-parser per entry.

A subcommand module provides ``add_arguments(parser)`` and ``run(args) -> int``. It is imported only when its
subcommand is chosen (see [Note: subcommands load on use]), so ``terastack --help`` imports no engine and no
torch. Every subcommand is listed in ``--help`` whether or not its engine's extra is installed; choosing one
whose extra is missing says in one line which ``pip install`` brings it: on choosing it when the command
``needs`` the package for everything it does, else when an action first imports it (``terastack gnn gen`` runs
without torch_geometric; ``terastack gnn train`` names the install).

[Note: subcommands load on use]
argparse hands the words after a subcommand's name to that sub-parser's ``parse_known_args``; a
:class:`LazyParser` adds its module's arguments there, the first time it is asked, and nowhere else. The parent
lists the subcommand from its table entry alone (name and help), so building the whole ``terastack`` parser
imports nothing but this module; ``terastack finetune --help`` loads the one module it shows.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: the optional packages terastack's engines import, and the extras (pyproject.toml) that install each
EXTRAS = {
    "transformers": ("llm", "dist"), "safetensors": ("llm",), "peft": ("llm",), "yaml": ("llm",),
    "datasets": ("llm-data",), "pyarrow": ("llm-data",), "deepspeed": ("llm-bench",),
    "torch_geometric": ("gnn",), "matplotlib": ("repro",),
}


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its ``name``, the ``module`` that implements it, its one-line ``help``, the optional
    packages it ``needs`` for everything it does (keys of :data:`EXTRAS`; checked before its module is imported),
    and the ``extra`` it suggests for a missing package that extra installs (else the package's first in
    :data:`EXTRAS`)."""
    name: str
    module: str
    help: str
    needs: tuple[str, ...] = ()
    extra: str = ""

    def extra_for(self, package: str) -> str:
        """The extra to install for ``package`` (a key of :data:`EXTRAS`) when this command misses it."""
        extras = EXTRAS[package]
        return self.extra if self.extra in extras else extras[0]


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (a name in pyproject's optional-dependencies)."""
    return f"pip install 'terastack[{extra}]' (from a checkout: pip install -e '.[{extra}]')"


def available(module: str) -> bool:
    """Whether ``module`` is installed (found without importing it, where it is a top-level module)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def missing_extra(exc: ModuleNotFoundError, command: Command | None = None) -> str | None:
    """For a ModuleNotFoundError of an optional package: one line naming it and the install command (the
    ``command``'s own extra where that installs the package); else None."""
    root = (exc.name or "").partition(".")[0]
    if root not in EXTRAS:
        return None
    extra = command.extra_for(root) if command is not None else EXTRAS[root][0]
    return f"needs {root}, which is not installed: {install_hint(extra)}"


class LazyParser(argparse.ArgumentParser):
    """A sub-parser whose arguments its command's module adds when the subcommand is chosen (parsed or shown)."""

    def __init__(self, *args, command: Command | None = None,
                 common: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._command = command
        self._common = common
        self._loaded = command is None

    def load(self) -> None:
        """Add the command's arguments (once). An optional package it needs that is missing ends the program
        with one line naming the ``pip install`` that brings it."""
        if self._loaded:
            return
        self._loaded = True
        cmd = self._command
        missing = [m for m in cmd.needs if not available(m)]
        if missing:
            hint = install_hint(cmd.extra_for(missing[0]))
            self.exit(2, f"{self.prog}: needs {', '.join(missing)}, which is not installed: {hint}\n")
        if self._common is not None:
            self._common(self)
        try:
            module = importlib.import_module(cmd.module)
        except ModuleNotFoundError as exc:
            line = missing_extra(exc, cmd)
            if line is None:
                raise
            self.exit(2, f"{self.prog}: {line}\n")
        module.add_arguments(self)

    def parse_known_args(self, args=None, namespace=None):
        self.load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.load()
        return super().format_help()

    def format_usage(self) -> str:
        self.load()
        return super().format_usage()


def add_subcommands(parser: argparse.ArgumentParser, table: Sequence[Command], *, dest: str, metavar: str,
                    module_key: str, required: bool = False,
                    common: Callable[[argparse.ArgumentParser], None] | None = None):
    """One sub-parser per entry of ``table`` under ``parser``, each loaded on use (:class:`LazyParser`). The chosen
    module's name is stored in ``module_key`` of the parsed arguments (the sub-parser itself in ``_parser``, for
    errors that print its usage; its entry in ``_command``, the innermost chosen); ``common`` adds arguments every entry shares. Returns the subparsers
    action."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar, required=required, parser_class=LazyParser)
    for cmd in table:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, command=cmd, common=common)
        p.set_defaults(**{module_key: cmd.module, "_parser": p, "_command": cmd})
    return sub
