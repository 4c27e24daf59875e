"""The names that lived here before the job was split by concern; new code imports them from where they live:
:mod:`terastack.dist.config` (settings), :mod:`terastack.dist.run` (what every rank runs),
:mod:`terastack.dist.launch` (the local launcher and failure messages), :mod:`terastack.dist.stats` and
:mod:`terastack.dist.baseline`. ``python -m terastack.dist.job JOB.json`` still runs one rank of the job."""
from __future__ import annotations

import sys

from terastack.dist.baseline import finish_baseline, init_baseline, save_final
from terastack.dist.config import FAULTS, TrainConfig, parse_kill_at
from terastack.dist.launch import JobFailed, classify_failure, describe_failures, launch_local, rank_main
from terastack.dist.run import main, run_role
from terastack.dist.stats import collect_stats, write_stats

__all__ = ["FAULTS", "JobFailed", "TrainConfig", "classify_failure", "collect_stats", "describe_failures",
           "finish_baseline", "init_baseline", "launch_local", "main", "parse_kill_at", "rank_main", "run_role",
           "save_final", "write_stats"]

if __name__ == "__main__":
    sys.exit(main())
