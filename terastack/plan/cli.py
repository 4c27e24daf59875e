"""``terastack plan``: what a job needs and how fast it will run, before running it.

One subcommand per planner (``terastack plan llm``); a planner module provides ``add_arguments(parser)`` and
``run(args) -> int`` and is imported only when chosen, like the top-level commands.
"""
from __future__ import annotations

import argparse
import importlib

from terastack.commands import Command, add_subcommands

PLANNERS = [
    Command("llm", "terastack.llm.plan_cmd", "LLM fine-tuning: placement, predicted step time and tokens/s, bottleneck",
            needs=("transformers",)),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_subcommands(parser, PLANNERS, dest="planner", metavar="PLANNER", required=True, module_key="_plan_module")


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._plan_module).run(args) or 0)
