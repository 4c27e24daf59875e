"""Ranks started warm: one process imports a rank program once and forks every rank of a launch from it.

A rank of ``dist train`` or of multi-process GNN training spends about two seconds of CPU importing torch and
terastack before its first line of work; a launch of five ranks on two cores waited five seconds for the same
imports five times. With warm starts (the default on Linux; ``TERASTACK_RANK_STARTS=cold`` turns them off) the
launcher (:func:`terastack.local_ranks.rank_command`) makes a listening socket (Linux's abstract namespace: no
file, no path length) and starts this server with it, ``python -m terastack.rank_server FD MODULE [PRELOAD...]``,
beside torchrun's agent. The server imports MODULE (and PRELOAD, the modules MODULE imports only once it runs),
and then forks one rank for each :mod:`terastack.rank_stub` of this user that connects (stubs that connect during
the imports wait in the socket's backlog).

[Note: a warm rank is the rank torchrun started]
torchrun's agent starts, watches, signals and reports on the stub; the stub stands in for its rank exactly:
- the rank runs ``MODULE`` as ``__main__`` with the stub's argv, environment, working directory and standard
  streams, in a session of its own (torchrun starts each rank so), its random state reseeded;
- a signal sent to the stub is passed on to the rank; a stub killed outright closes its connection, and the rank
  kills itself when it sees that ([Note: a killed stub]);
- the server reports how each rank ended (its wait status) to its stub, which ends the same way: the same exit
  code, or killed by the same signal. torchrun's failure records, and the job's message naming the first rank to
  fail and how, read as they would for a rank torchrun had started itself.
The server never runs a torch operation before forking (a forked process must not inherit a thread pool that has
started), ignores SIGINT (the launcher passes Ctrl-C on to the stubs), and ends when the launcher closes its stdin.
"""
from __future__ import annotations

import atexit
import importlib
import io
import json
import os
import random
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback

_WORD = struct.Struct("!q")
#: a stub sends its request at once after it connects; one that stalls is dropped after this long
REQUEST_TIMEOUT_S = 30.0


def serve(listen_fd: int, module: str, preload: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = socket.socket(fileno=listen_fd)
    for name in (module, *preload):
        try:
            importlib.import_module(name)
        except Exception:   # noqa: BLE001 - it fails again in a rank that needs it, which reports it as a cold
            continue         # start does; a preload that fails only starts nothing warm
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)   # wakes the selector below
    stubs: dict[int, socket.socket] = {}   # rank pid -> its stub's connection
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ, "stub")
    events.register(wake_r, selectors.EVENT_READ, "child")
    events.register(sys.stdin.fileno(), selectors.EVENT_READ, "launcher")
    while True:
        for key, _ in events.select():
            if key.data == "stub":
                conn, _ = listener.accept()
                if not _same_user(conn):
                    conn.close()
                    continue
                server_fds = [listener.fileno(), wake_r, wake_w, sys.stdin.fileno(),
                              *(c.fileno() for c in stubs.values())]
                pid = _start_rank(conn, module, server_fds)
                if pid is not None:
                    stubs[pid] = conn
            elif key.data == "child":
                os.read(wake_r, 512)
            elif not os.read(sys.stdin.fileno(), 512):   # the launcher is done (or gone)
                return
        _report_ended(stubs)


def _same_user(conn: socket.socket) -> bool:
    """An abstract socket has no file permissions: only a process of this user may have a rank started."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def _report_ended(stubs: dict[int, socket.socket]) -> None:
    while stubs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = stubs.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(_WORD.pack(status))
            except OSError:
                pass   # the stub is gone; nobody is left to tell
            conn.close()


def _start_rank(conn: socket.socket, module: str, server_fds: list[int]) -> int | None:
    """Read one stub's request and fork its rank; the rank's pid (None for a request that could not be read)."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    try:
        header, fds, _, _ = socket.recv_fds(conn, _WORD.size, 3)
        size = _WORD.unpack(header)[0]
        payload = b""
        while len(payload) < size:
            chunk = conn.recv(size - len(payload))
            if not chunk:
                raise ConnectionError("the stub closed its request")
            payload += chunk
        request = json.loads(payload)
    except (OSError, ValueError, struct.error) as exc:
        print(f"terastack: a rank's request could not be read ({exc})", file=sys.stderr, flush=True)
        conn.close()
        return None
    conn.settimeout(None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:   # the rank: never returns to the loop above
        code = 1
        try:
            code = _run_rank(conn, request, fds, module, server_fds)
        except BaseException:   # noqa: BLE001 - anything here must end the rank, never the server's loop
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(_WORD.pack(pid))
    except OSError:
        pass   # the stub is gone; its rank sees that and ends ([Note: a killed stub])
    return pid


def _run_rank(conn: socket.socket, request: dict, fds: list[int], module: str, server_fds: list[int]) -> int:
    for fd in server_fds:
        os.close(fd)
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGCHLD", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]   # as ``python -m`` sets it
    _fresh_standard_streams()
    _reseed()
    threading.Thread(target=_die_with_stub, args=(conn,), name="terastack-stub-watch", daemon=True).start()
    argv = request["argv"]
    if argv[:2] != ["-m", module]:
        print(f"terastack: this rank server runs {module}, not {' '.join(argv[:2])}", file=sys.stderr)
        return _leave(2)
    sys.argv = [module, *argv[2:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return _leave(_exit_code(exc))
    except KeyboardInterrupt:
        traceback.print_exc()
        _leave(None)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)   # as Python ends on an uncaught Ctrl-C: killed by SIGINT
        return 128 + signal.SIGINT
    except BaseException:   # noqa: BLE001 - an uncaught error ends the rank as it ends a Python process
        sys.excepthook(*sys.exc_info())
        return _leave(1)
    return _leave(0)


def _die_with_stub(conn: socket.socket) -> None:
    """[Note: a killed stub] The stub sends nothing after its request: its connection reads empty only once the
    stub is gone, and a rank whose stub is gone (killed by torchrun after its shutdown timeout, say) must not live
    on unwatched."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _leave(code):
    """What a Python process does on its way out: wait for non-daemon threads, run atexit, flush the streams."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _fresh_standard_streams() -> None:
    """Text streams over the rank's own descriptors, buffered as a fresh interpreter buffers them."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    enc = os.environ.get("PYTHONIOENCODING", "").split(":")[0] or sys.stdout.encoding
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding=enc)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
        stream = io.TextIOWrapper(raw, encoding=enc, errors="backslashreplace" if fd == 2 else "strict",
                                  line_buffering=fd == 2 or os.isatty(fd), write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reseed() -> None:
    """A fresh process draws its seeds from the OS; forked ranks would otherwise share the server's."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
