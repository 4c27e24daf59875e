"""``python -m terastack.disdp.job_rank JOB.yaml``: the program every rank of a job that ``terastack dist train``
starts on this machine runs (:func:`terastack.disdp.job_run.launch_job`).

It takes SIGINT over before it imports anything else ([Note: Ctrl-C on a job] in
:mod:`terastack.disdp.shutdown`): the job's modules take seconds to import (torch among them), and a Ctrl-C in
those seconds would otherwise end the rank with a KeyboardInterrupt traceback. Rank 0 notes it (the job stops at
its first command); every other rank ignores it.
"""
from __future__ import annotations

import os
import signal


def main(argv: list[str] | None = None) -> int:
    early: list[int] = []
    if os.environ.get("RANK") == "0":
        signal.signal(signal.SIGINT, lambda signum, frame: early.append(signum))
    else:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    from terastack.disdp import job_run

    return job_run.main(argv, early_interrupts=early)


if __name__ == "__main__":
    from terastack.process_end import end_without_teardown

    end_without_teardown(main())   # [Note: a process leaves without teardown]
