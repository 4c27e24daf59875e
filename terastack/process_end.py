"""End a finished child process -- a job's rank, a benchmark's worker -- without the interpreter's teardown.

[Note: a process leaves without teardown]
After a program's last line, CPython tears down every module and object it loaded; with torch and transformers
that is about a second of CPU (measured here: 0.9-1.4 s for a process that imported both). A job's ranks share
their machine's cores, so their teardowns queue: a job of 7 ranks on 2 cores spent 3.8 s between its ranks' exit
handlers and their ends, and the launcher waits for all of them; a benchmark waits for each of its workers the
same way. Nothing a finished child holds needs the teardown -- the code that wrote its files closed them, a rank
has destroyed its process group -- so it waits for its non-daemon threads (as a normal exit does), runs the exit
handlers (torch's, multiprocessing's, the user's), flushes its streams and logs, and ends. A child that fails
raises instead, and ends as any Python program does.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import NoReturn


def end_without_teardown(code: int) -> NoReturn:
    """End this process with ``code`` now (see the note above); only for a child whose work is done."""
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
