"""The benchmarks' RSS watchdog (terastack.bench_watchdog): a process tree's summed peaks held below a limit by
killing the tree, or a process watching itself that stops past its limit, saying why."""
import os
import subprocess
import sys

import pytest

from terastack.bench_watchdog import EXIT_STATUS, RssWatchdog, tree_rss_bytes
from terastack.memory import current_rss


def test_watchdog_kills_a_process_tree_past_its_limit():
    import signal

    # both sleep far longer than the child's wait: only the watchdog ends them (the SIGKILL says so)
    grow = "import time; x = b'1' * (300 << 20); time.sleep(600)"   # written, so resident
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grow!r}]); time.sleep(600)"
    with RssWatchdog(RssWatchdog.Config(limit_bytes=200 << 20, interval_s=0.02)) as dog:
        child = subprocess.Popen([sys.executable, "-c", parent])
        child.wait(timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert dog.exceeded and dog.peak_total > 200 << 20
    # the child and its own child (the one holding the 300 MB) both counted; other children of the test process
    # (a test before this one may have left one behind) may be counted too
    grown = [pid for pid, peak in dog.peaks.items() if peak > 150 << 20]
    assert child.pid in dog.peaks and grown and child.pid not in grown, dog.peaks


def test_a_process_running_before_the_watch_is_neither_counted_nor_killed():
    """A helper an earlier run left behind (a fork server holding its imports) is not the watched run's."""
    hold = "import sys, time; x = b'1' * (260 << 20); sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(600)"
    earlier = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert earlier.stdout.readline() == "ready\n"      # its 260 MB are resident before the watch begins
        with RssWatchdog(RssWatchdog.Config(limit_bytes=200 << 20, interval_s=0.02)) as dog:
            run = subprocess.Popen([sys.executable, "-c", "x = b'1' * (8 << 20)"])
            run.wait(timeout=120)
        assert not dog.exceeded and earlier.pid not in dog.peaks
        assert earlier.poll() is None                     # still running: not the run's to kill
    finally:
        earlier.kill()
        earlier.wait()


def test_watchdog_does_not_count_a_fork_of_the_benchmark_before_it_runs_its_program():
    """Between fork and exec a child reports the benchmark's own RSS, which alone can pass the limit."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # a copy of this process that never runs exec
        os.close(write_end)
        os.read(read_end, 1)                           # lives until the test closes the pipe (or kills it)
        os._exit(0)
    os.close(read_end)
    try:
        dog = RssWatchdog(RssWatchdog.Config(limit_bytes=1 << 20))
        assert dog.sample() == 0 and pid not in dog.peaks, dog.peaks
    finally:
        os.close(write_end)
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_process_watching_itself_counts_its_own_resident_set():
    # (children another test of this process left behind count as descendants: the figures are read beside them)
    alone = RssWatchdog(RssWatchdog.Config(limit_bytes=1 << 40))
    assert alone.sample() == alone.peak_total and os.getpid() not in alone.peaks   # nothing of this process
    me = RssWatchdog(RssWatchdog.Config(limit_bytes=1 << 40, include_self=True))
    before = current_rss()
    total = me.sample()
    assert total - me.peak_total >= 0.5 * before and total == me.max_sampled and os.getpid() not in me.peaks


def test_a_process_past_its_limit_stops_its_children_says_why_and_exits():
    script = (
        "import subprocess, sys, time\n"
        "from terastack.bench_watchdog import RssWatchdog\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(child.pid, flush=True)\n"
        "cfg = RssWatchdog.Config(limit_bytes=1 << 20, interval_s=0.02, include_self=True, on_exceed='exit',\n"
        "                         label='contender \"small\"')\n"
        "with RssWatchdog(cfg):\n"
        "    time.sleep(600)\n")                       # ended by the watchdog, long before
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_STATUS, done.stderr
    assert 'contender "small": resident memory' in done.stderr and "passed --rss-limit 1.00 MiB" in done.stderr
    child = int(done.stdout.split()[0])
    assert _ended(child)                               # killed by the watchdog (gone, or a zombie not yet reaped)


def _ended(pid: int) -> bool:
    """Whether ``pid`` has ended (or does so within a minute: a SIGKILLed process still runs its exit, for as long
    as a busy machine takes to schedule it). A pidfd becomes readable when its process ends: waited on, not
    polled; the child's own sleep (600 s) is what a watchdog that did not kill it would leave."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True                                    # gone, reaped
    try:
        return bool(select.select([fd], [], [], 60)[0])
    finally:
        os.close(fd)


def test_tree_rss_counts_a_grandchild_holding_memory(tmp_path):
    """The resident bytes of a tree: a child whose own child holds 300 MB counts them; a gone pid counts 0."""
    holder = tmp_path / "holder.py"
    holder.write_text("import sys\nb = bytearray(300 << 20)\nprint('held', flush=True)\nsys.stdin.read()\n")
    parent = tmp_path / "parent.py"
    parent.write_text("import subprocess, sys\n"
                      f"p = subprocess.Popen([sys.executable, {str(holder)!r}], stdin=subprocess.PIPE, "
                      "stdout=subprocess.PIPE)\n"
                      "p.stdout.readline()\nprint('ready', flush=True)\nsys.stdin.read()\np.stdin.close()\n"
                      "p.wait()\n")
    child = subprocess.Popen([sys.executable, str(parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert tree_rss_bytes(child.pid) >= 300 << 20
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert tree_rss_bytes(child.pid) == 0


def test_config_names_the_field():
    with pytest.raises(ValueError, match="on_exceed"):
        RssWatchdog.Config(limit_bytes=1, on_exceed="warn")
    with pytest.raises(ValueError, match="limit_bytes"):
        RssWatchdog.Config(limit_bytes=0)
