"""The write-back allowance shared by the optimizer's state and the gradient sums: which writes a new one waits for."""
from concurrent.futures import Future

import pytest

from terastack.llm.engine.writeback_window import WritebackWindow


class Runtime:
    """Records the futures waited for; a wait completes a pending write (as the SSD would, in time)."""

    def __init__(self):
        self.waited = []

    def wait(self, fut, what):
        self.waited.append(fut)
        if not fut.done():
            fut.set_result(None)
        return fut.result()


def pending():
    return Future()


def done():
    f = Future()
    f.set_result(None)
    return f


def test_waits_for_the_oldest_until_the_new_write_fits():
    rt = Runtime()
    w = WritebackWindow(rt, 100, what="test", cat="test")
    a, b, c = pending(), pending(), pending()
    w.add(a, 60)
    w.add(b, 30)
    w.make_room(10)  # 60 + 30 + 10 = 100: fits
    assert rt.waited == []
    w.add(c, 10)
    w.make_room(20)  # 120 > 100: the oldest (a) goes, then 40 + 20 fits
    assert rt.waited == [a] and w.in_flight_bytes == 40
    assert not b.done() and not c.done()


def test_finished_writes_leave_without_a_wait_that_blocks():
    rt = Runtime()
    w = WritebackWindow(rt, 50, what="test", cat="test")
    first, second = done(), pending()
    w.add(first, 40)
    w.add(second, 10)
    w.make_room(40)  # the finished one is dropped; 10 + 40 fits, so the pending one stays
    assert rt.waited == [first] and not second.done() and w.in_flight_bytes == 10


def test_a_write_larger_than_the_allowance_goes_one_at_a_time():
    rt = Runtime()
    w = WritebackWindow(rt, 16, what="test", cat="test")
    w.make_room(64)  # nothing in flight: it goes at once
    a = pending()
    w.add(a, 64)
    w.make_room(64)  # the previous large write must finish first
    assert rt.waited == [a] and w.in_flight_bytes == 0


def test_a_failed_write_is_raised_by_the_next_room_made():
    rt = Runtime()
    w = WritebackWindow(rt, 100, what="test", cat="test")
    failed = Future()
    failed.set_exception(OSError("no space left on device"))
    w.add(failed, 10)
    with pytest.raises(OSError, match="no space"):
        w.make_room(10)
