"""``terastack plan``: what a job needs and how fast it will run, before running it.

One subcommand per planner (``terastack plan llm``); a planner module provides ``add_arguments(parser)`` and
``run(args) -> int`` and is listed only when it is installed, like the top-level commands.
"""
from __future__ import annotations

import argparse
import importlib

from terastack.commands import add_subcommands

#: (subcommand, module, one-line help)
PLANNERS = [
    ("llm", "terastack.llm.plan_cmd", "LLM fine-tuning: placement, predicted step time and tokens/s, bottleneck"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="planner", metavar="PLANNER", required=True)
    add_subcommands(sub, PLANNERS, module_key="_plan_module")

def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._plan_module).run(args) or 0)
