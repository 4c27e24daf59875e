"""What torchrun's agent starts for each rank when ranks start warm (:mod:`terastack.rank_server`):
``python -I -S rank_stub.py NAME -m MODULE ARGS...``, NAME the server's abstract socket.

It imports nothing but the standard library (it is run by path, never imported), so it starts in milliseconds. It
asks the rank server for a rank, handing it this process's argv, environment, working directory and standard
streams, and then stands in for that rank: a signal sent to it is passed on to the rank, and it ends the way the
rank ended (the same exit code, or killed by the same signal), so torchrun's agent sees what it would have seen
from a rank it had started itself. If this process is killed (SIGKILL cannot be passed on), the rank sees its
connection close and kills itself.
"""
import json
import os
import signal
import socket
import struct
import sys
import time

#: the signals passed on to the rank: everything a launcher, torchrun's agent or a terminal sends
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
_WORD = struct.Struct("!q")


def main(argv: list[str]) -> int:
    name, rank_argv = argv[0], argv[1:]
    conn = _connect(name)
    payload = json.dumps({"argv": rank_argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [_WORD.pack(len(payload))], [_open_or_null(fd) for fd in (0, 1, 2)])
    conn.sendall(payload)
    pid = _read_word(conn)
    if pid is None:
        return _fail("the rank server ended before it started this rank")
    for signame in FORWARDED:
        signal.signal(getattr(signal, signame), lambda signum, frame: _pass_on(pid, signum))
    status = _read_word(conn)
    if status is None:
        return _fail(f"the rank server ended before it could say how rank process {pid} ended")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):   # the two whose action cannot be set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)   # end as the rank ended
        time.sleep(1.0)
        return 128 + sig
    return os.WEXITSTATUS(status)


def _connect(name: str) -> socket.socket:
    """A connection to the server listening on the abstract socket ``name``. The launcher made it listen before
    torchrun started any stub, so a refusal means the server has ended."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect("\0" + name)
    except ConnectionRefusedError:
        raise SystemExit(f"terastack: the rank server {name} has ended; no rank was started") from None
    return conn


def _open_or_null(fd: int) -> int:
    """``fd`` if it is open, else /dev/null in its place (the rank gets the same three streams either way)."""
    try:
        os.fstat(fd)
        return fd
    except OSError:
        return os.open(os.devnull, os.O_RDWR)


def _read_word(conn: socket.socket):
    data = b""
    while len(data) < _WORD.size:
        chunk = conn.recv(_WORD.size - len(data))
        if not chunk:
            return None
        data += chunk
    return _WORD.unpack(data)[0]


def _pass_on(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _fail(message: str) -> int:
    print(f"terastack: {message}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
