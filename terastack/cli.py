"""The ``terastack`` command: one subcommand per engine.

Subcommands live in their own modules (imported only when used, so ``--help``
stays fast); a module provides ``add_arguments(parser)`` and ``run(args) -> int``.
Engines that are not installed are simply absent from ``--help``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from terastack.commands import add_subcommands

#: (subcommand, module, one-line help)
COMMANDS = [
    ("finetune", "terastack.llm.finetune_cmd", "fine-tune a causal LM larger than memory (default: built-in tiny Llama)"),
    ("merge", "terastack.training.hf.merge", "merge a LoRA adapter into its base model: a full model transformers loads"),
    ("plan", "terastack.plan.cli", "predict placement and step time for a model on given hardware"),
    ("gnn", "terastack.gnn.cli", "out-of-core GNN training: gen, import, train, advise"),
    ("dist", "terastack.disdp.cli", "disaggregated sharded data parallel: train, simulate"),
    ("repro", "terastack.repro.cli", "run the reproduction suites and write REPORT.md"),
    ("bench", "terastack.bench", "run a benchmark against its baseline in the same run"),
    ("probe", "terastack.probe", "measure this machine (compute, memory, SSD) and cache the result"),
]



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="terastack",
        description="Train models and data larger than memory: tensors move asynchronously across "
                    "device, host, SSD and parameter servers.")
    from terastack import __version__

    parser.add_argument("--version", action="version", version=f"terastack {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_subcommands(sub, COMMANDS, module_key="_module")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 0
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, MemoryError, RuntimeError) as exc:
        # Bad input and resource errors are reported as one clear line, not a traceback.
        if getattr(args, "debug", False):
            raise
        print(f"terastack {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
