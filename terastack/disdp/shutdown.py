"""Leaving a job's process group in order: every thread that talks to the network has ended before the group
is destroyed, and the group is destroyed before the process exits, whether the rank succeeded or failed.

[Note: a thread inside the network at exit]
A thread that is inside a call into torch.distributed (a receive's ``wait``, a store's ``add``) has released
the GIL. If that call returns after the interpreter has begun to finalize, the thread cannot take the GIL
back: CPython ends it with ``pthread_exit`` from inside a C++ destructor (pybind11's GIL guard), and the C++
runtime answers with ``std::terminate``: the rank dies with SIGABRT, "terminate called without an active
exception", after its work was done. torchrun then reports a rank killed by a signal, which
:func:`terastack.disdp.launch.describe_failures` ranks first as the likeliest cause of a failure. So:

- every background thread of a rank that uses the process group or the job's store is registered here
  (:func:`track`) and joined by its owner before the rank leaves (the agent's threads at the end of every pass,
  the heartbeat when the rank leaves);
- :func:`destroy_group` destroys the process group explicitly, on success and on failure;
- on a failure a thread may still be blocked on a peer that will never answer (destroying the group does not
  wake it: a pending receive keeps its connection alive). :func:`exit_rank` waits for such threads a short
  while, destroys the group and, if one is still inside the network, ends the process with ``os._exit`` once
  the error has been printed and recorded (by torchrun's ``record``), so that no finalization runs under it.

[Note: Ctrl-C on a job]
A terminal's Ctrl-C sends SIGINT to every process of the job: the launcher and every rank. A rank that raised
KeyboardInterrupt wherever it stood would leave its peers waiting inside a pass for messages that never come
(and torchrun would kill them: per-rank tracebacks, exit 1). So the ranks hand the interrupt to rank 0, which
stops them all between two commands:

- every rank but rank 0 ignores SIGINT (:func:`follow_interrupts`): it ends when rank 0 says STOP;
- rank 0 notes it (:func:`defer_interrupts`) and raises KeyboardInterrupt at the next :func:`stop_point`, which
  rank 0 reaches before it announces each command ([Note: step messages] in :mod:`terastack.disdp.control`):
  there every rank has finished the command before, so rank 0 announces STOP and every rank leaves in order,
  with exit status 0;
- the launcher (:func:`terastack.disdp.launch.launch_ranks`) keeps torchrun's agent from answering SIGINT by
  killing the ranks, passes the signal on to its ranks (a SIGINT sent to the launcher alone), waits for them,
  and reports one line ([Note: an interrupted run] in :mod:`terastack.training.interrupt`), exit status 130.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
import weakref

import torch.distributed as dist

#: how long a failing rank waits for its network threads to end before it exits without finalizing
STRANDED_WAIT_S = 2.0

_interrupt = threading.Event()    # a SIGINT was noted and not yet raised ([Note: Ctrl-C on a job])
_raised = threading.Event()       # raised once: the stop that follows must not be interrupted again

_threads: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
_lock = threading.Lock()


def track(thread: threading.Thread) -> threading.Thread:
    """Register ``thread`` as one that calls into torch.distributed (returned, for chaining)."""
    with _lock:
        _threads.add(thread)
    return thread


def alive() -> list[threading.Thread]:
    """The registered threads still running (other than the calling thread)."""
    me = threading.current_thread()
    with _lock:
        return [t for t in _threads if t.is_alive() and t is not me]


def join_all(timeout_s: float) -> list[threading.Thread]:
    """Join every registered thread within ``timeout_s`` in all; the ones still running."""
    deadline = time.monotonic() + timeout_s
    for t in alive():
        t.join(max(0.0, deadline - time.monotonic()))
    return alive()


def destroy_group() -> None:
    """Destroy the default process group (and every group made from it) if there is one; never raises (on a
    failure path the group may already be broken)."""
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:   # noqa: BLE001 - leaving anyway; the rank's own error is the one to report
        pass


def defer_interrupts(earlier: list | None = None) -> None:
    """Rank 0: SIGINT is noted, and raised as KeyboardInterrupt at the next :func:`stop_point`. ``earlier``: the
    SIGINTs an earlier handler noted (non-empty: one is pending), read once this handler is in place so that
    none is lost between the two."""
    _interrupt.clear()
    _raised.clear()
    signal.signal(signal.SIGINT, lambda signum, frame: _interrupt.set())
    if earlier:
        _interrupt.set()


def follow_interrupts() -> None:
    """Every rank but rank 0: SIGINT is ignored (rank 0 ends the job on it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_point() -> None:
    """Raise KeyboardInterrupt here if a SIGINT was noted ([Note: Ctrl-C on a job]); once per process."""
    if _interrupt.is_set() and not _raised.is_set():
        _raised.set()
        raise KeyboardInterrupt


def exit_rank(entry, *args) -> int:
    """Run ``entry(*args)`` (a rank's whole life, usually under torchrun's ``record``) and leave in order
    ([Note: a thread inside the network at exit]): on success the group is destroyed (if ``entry`` has not done
    so); on a failure the group is destroyed too, and a thread left inside the network ends the process with
    ``os._exit(1)`` after the traceback is printed, instead of a SIGABRT during finalization."""
    try:
        code = entry(*args)
    except SystemExit:
        raise
    except BaseException:
        stranded = join_all(STRANDED_WAIT_S)
        destroy_group()
        if stranded:
            traceback.print_exc()
            _flush_and_exit(1)
        raise
    stranded = join_all(STRANDED_WAIT_S)
    destroy_group()
    if stranded:
        _flush_and_exit(code)
    return code


def _flush_and_exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
