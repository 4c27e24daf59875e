"""What a job says when Ctrl-C ends it: one line with where it stood, its newest checkpoint and the exact command
that continues from it ([Note: an interrupted run]). Every command that runs a job (``terastack finetune``,
``terastack dist train``) ends an interrupted run with exit status :data:`INTERRUPTED_EXIT` and this line."""
from __future__ import annotations

import contextlib
import shlex
import signal
import threading

#: the exit status of an interrupted job (128 + SIGINT, as a shell reports it)
INTERRUPTED_EXIT = 130


class JobInterrupted(KeyboardInterrupt):
    """Ctrl-C ended the job (every rank of a distributed one left in order); the message is the one line to
    print ([Note: an interrupted run]). Still a KeyboardInterrupt for whoever does not know it."""


def resume_command(argv: list[str] | None, checkpoint: str, *, command: tuple[str, ...] = ("finetune",)) -> str:
    """The command line that continues this run from ``checkpoint``: the same words (``argv``: the words after
    ``terastack``; None: ``command``), any ``--resume`` among them replaced."""
    words, skip = [], False
    for word in argv or list(command):
        if skip:
            skip = False
        elif word == "--resume":
            skip = True
        elif not (word.startswith("--resume=") or word.split("=", 1)[0] in ("resume", "checkpoint.resume")):
            words.append(word)
    return shlex.join(["terastack", *words, "--resume", checkpoint])


def latest_checkpoint(checkpoint_dir: str | None):
    """The newest complete checkpoint in ``checkpoint_dir`` (its ``LATEST`` pointer) as a
    :class:`~terastack.training.loop.LastCheckpoint`, or None."""
    from terastack.training.checkpoint import latest_step
    from terastack.training.loop import LastCheckpoint

    if not checkpoint_dir:
        return None
    try:
        step = latest_step(checkpoint_dir)
    except ValueError:   # an unreadable pointer: nothing to resume from, as with none
        return None
    return None if step is None else LastCheckpoint(str(checkpoint_dir), step)


def interrupted_line(*, step: int | None, total: int | None, last, argv: list[str] | None,
                     checkpoint_dir: str | None = None, command: tuple[str, ...] = ("finetune",),
                     where: str | None = None) -> str:
    """[Note: an interrupted run]
    Ctrl-C anywhere in a job ends it with exit status 130 and one line: the step reached, the newest checkpoint
    of the job (``last``: a loop's ``LastCheckpoint``, the resumed one until this run writes one; None: none) and
    the exact command that resumes from it -- or that there is none to resume from. ``where`` replaces "at step
    N of M" / "before training started" (a command that does not know the step it reached: None for both
    ``step`` and ``where`` says only "interrupted" when ``last`` is known)."""
    if where is None:
        where = "before training started" if step is None else f"at step {step}" + (f" of {total}" if total else "")
    head = f"interrupted {where}".rstrip()
    if last is None:
        how = (f"none was written to {checkpoint_dir} yet" if checkpoint_dir else
               "--checkpoint DIR --checkpoint-every N keeps one")
        return f"{head}; no checkpoint to resume from ({how})"
    return (f"{head}; last checkpoint {last.path} (step {last.step}); resume with: "
            f"{resume_command(argv, last.path, command=command)}")


#: the exit status of a job ended by SIGTERM (128 + SIGTERM, as a shell reports it)
TERMINATED_EXIT = 143


@contextlib.contextmanager
def terminate_as_exit():
    """While the block runs, SIGTERM (``kill PID``, a scheduler's stop, a container's shutdown) raises
    ``SystemExit(143)`` in the main thread instead of ending the process on the spot, so every ``finally`` and
    ``with`` of the job runs: its scratch store is removed, its output lock and files are released
    ([Note: a scratch store's owner] in :mod:`terastack.training.scratch_store`). The handler before is put back
    after the block. Outside the main thread (where Python cannot set handlers) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        raise SystemExit(TERMINATED_EXIT)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
