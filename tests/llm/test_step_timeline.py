"""The step's timeline read out of a trace: compute less the waits inside it, and the disk's busy share."""
import pytest

from terastack.llm.bench.step_timeline import step_timelines


def _events(spans):
    """Chrome-trace events of ``spans`` = [(track lane, cat, start s, end s)]."""
    lanes = sorted({lane for lane, *_ in spans})
    tid = {lane: i + 1 for i, lane in enumerate(lanes)}
    meta = [{"name": "thread_name", "ph": "M", "tid": tid[lane], "args": {"name": lane}} for lane in lanes]
    return meta + [{"name": f"{lane} {i}", "cat": cat, "ph": "X", "tid": tid[lane], "ts": a * 1e6,
                    "dur": (b - a) * 1e6} for i, (lane, cat, a, b) in enumerate(spans)]


def test_compute_waits_and_disk_share_of_each_step():
    events = _events([
        ("step", "step", 0, 10), ("step", "step", 10, 14),
        # step 0: units 0-4 and 5-9 with a recompute nested in the second (counted once), a wait of 1 s inside
        # it and one outside any unit (another thread's: not the training thread's wait)
        ("compute", "forward", 0, 4), ("compute", "backward", 5, 9), ("compute#2", "forward", 6, 7),
        ("stall", "weights", 5, 6), ("stall#2", "state", 4.2, 4.8),
        # an update inline inside the backward (7-8.5) with a wait for its state (8-8.2) inside it
        ("optimizer", "optimizer", 7, 8.5), ("stall#3", "state", 8, 8.2),
        # the disk: two overlapping requests (2-5 and 3-6) and one more (8-9): busy 5 s of 10
        ("io", "io", 2, 5), ("io#2", "io", 3, 6), ("io", "io", 8, 9),
        # a prefetch span on the io track is bookkeeping, not a request
        ("io", "prefetch", 9, 10),
        # step 1: compute 3 s, no disk
        ("compute", "forward", 10, 13),
    ])
    first, second = step_timelines(events)
    assert first["seconds"] == pytest.approx(10)
    assert first["compute_s"] == pytest.approx(8 - 1.2)
    assert first["stall_s"] == pytest.approx(1.2)
    assert first["update_s"] == pytest.approx(1.5 - 0.2)
    assert first["disk_busy_share"] == pytest.approx(0.5)
    assert second["compute_s"] == pytest.approx(3) and second["disk_busy_share"] == 0 and second["update_s"] == 0


@pytest.mark.parametrize("order", ["horizontal", "vertical"])
def test_an_accumulated_step_is_one_step_of_the_timeline(order, tmp_path, trainer_config):
    """Two optimizer steps of two micro-batches each, traced: two steps in the timeline (the horizontal order's
    micro-batches are spans inside their step, not steps), each inside the step the trainer timed (which starts
    its clock before the step's span and reads it after: no tolerance that a busy machine could pass)."""
    from terastack import trace
    from terastack.llm import Trainer

    from .llm_helpers import batches, make_model

    make_model("llama", tmp_path / "model", layers=2)
    data = batches(4)
    with Trainer.from_pretrained(tmp_path / "model", trainer_config(grad_accum=2, accumulation=order)) as t:
        assert t.plan.accumulation == order
        trace.tracer.start()
        try:
            for k in range(2):
                t.step_accumulated([{"input_ids": ids} for ids in data[2 * k:2 * k + 2]])
            t.synchronize()
        finally:
            trace.tracer.stop()
            events = trace.tracer.events()
            trace.tracer.clear()
        timed = [h.seconds for h in t.history]
    steps = step_timelines(events)
    assert len(steps) == 2
    for step, seconds in zip(steps, timed):
        assert 0 < step["compute_s"] <= step["seconds"] <= seconds
