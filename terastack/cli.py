"""The ``terastack`` command: one subcommand per engine.

Subcommands live in their own modules, imported only when chosen (``terastack --help`` imports no engine and no
torch; see :mod:`terastack.commands`); a module provides ``add_arguments(parser)`` and ``run(args) -> int``.
Every subcommand is listed; one whose engine's extra is missing says which ``pip install`` brings it.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from contextlib import contextmanager

from terastack.commands import Command, add_subcommands, missing_extra

COMMANDS = [
    Command("finetune", "terastack.llm.finetune_cmd",
            "fine-tune a causal LM larger than memory (default: built-in tiny Llama)", needs=("transformers",)),
    Command("merge", "terastack.training.hf.merge",
            "merge a LoRA adapter into its base model: a full model transformers loads", needs=("transformers",)),
    Command("plan", "terastack.plan.cli", "predict placement and step time for a model on given hardware"),
    # gen, import and verify run without torch_geometric; train and infer say which install brings it
    Command("gnn", "terastack.gnn.cli", "out-of-core GNN training: gen, import, verify, train, infer, advise"),
    # simulate runs without transformers; train says which install brings it
    Command("dist", "terastack.disdp.cli", "disaggregated sharded data parallel: train (a finetune job file), demo, simulate", extra="dist"),
    Command("repro", "terastack.repro.cli", "run the reproduction suites and write REPORT.md"),
    Command("bench", "terastack.bench", "run a benchmark against its baseline in the same run"),
    Command("probe", "terastack.probe", "measure this machine (compute, memory, SSD) and cache the result"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="terastack",
        description="Train models and data larger than memory: tensors move asynchronously across "
                    "device, host, SSD and parameter servers.")
    from terastack import __version__

    parser.add_argument("--version", action="version", version=f"terastack {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    add_subcommands(parser, COMMANDS, dest="command", metavar="COMMAND", module_key="_module")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 0
    module = importlib.import_module(args._module)
    args._argv = list(argv)  # the words as given: a command that stops early can say how to go on
    try:
        with one_line_notices(f"terastack {args.command}"):
            return int(module.run(args) or 0)
    except ModuleNotFoundError as exc:
        # An optional package the command reached for at run time: say which install brings it.
        line = missing_extra(exc, getattr(args, "_command", None))
        if line is None or getattr(args, "debug", False):
            raise
        print(f"terastack {args.command}: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # a command that knows where it stood says so itself and returns 130 (terastack finetune)
        print(f"terastack {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, MemoryError, RuntimeError, ImportError) as exc:
        # Bad input and resource errors are reported as one clear line, not a traceback; so is a library a chosen
        # setting needs and lacks (terastack.plan.lowbit_library names the setting and the install).
        if getattr(args, "debug", False):
            raise
        print(f"terastack {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


@contextmanager
def one_line_notices(prefix: str):
    """terastack's notices (:class:`terastack.errors.Notice`) as one line each, ``prefix: note: ...``; other
    warnings as Python shows them."""
    from terastack.errors import Notice

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, Notice):
            print(f"{prefix}: note: {message}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())
