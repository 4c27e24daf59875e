"""``terastack plan``: what a job needs and how fast it will run, before running it.

One subcommand per planner (``terastack plan llm``); a planner module provides ``add_arguments(parser)`` and
``run(args) -> int`` and is listed only when it is installed, like the top-level commands.
"""
from __future__ import annotations

import argparse
import importlib

from terastack.cli import available

#: (subcommand, module, one-line help)
PLANNERS = [
    ("llm", "terastack.llm.plan_cmd", "LLM fine-tuning: placement, predicted step time and tokens/s, bottleneck"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="planner", metavar="PLANNER", required=True)
    for name, module, help_text in PLANNERS:
        if not available(module):
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_plan_module=module)
        importlib.import_module(module).add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args._plan_module).run(args) or 0)
