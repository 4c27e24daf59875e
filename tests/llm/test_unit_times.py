"""A trainer keeps its units' calibrated times beside the machine's probe: a later trainer on the machine (a resume,
the next job, another process) plans from them without timing its units again."""
from .llm_helpers import make_model
from terastack.llm import Trainer
from terastack.llm.engine import profile


def test_a_later_trainer_plans_from_the_kept_unit_times(tmp_path, trainer_config, monkeypatch):
    make_model("llama", tmp_path / "model", layers=2)
    timed = []
    time_unit = profile._time_unit

    def counted(unit, *args, **kwargs):
        timed.append(unit.path)
        return time_unit(unit, *args, **kwargs)

    monkeypatch.setattr(profile, "_time_unit", counted)
    plans = []
    for _ in range(2):
        monkeypatch.setattr(profile, "_CALIBRATED", {})  # a new process remembers nothing of the last
        with Trainer.from_pretrained(tmp_path / "model", trainer_config(calibrate=True)) as t:
            plans.append(t.plan.prediction.step_s)
        if len(plans) == 1:
            first = len(timed)
            assert first > 0 and profile.unit_times_path().is_file()
    assert len(timed) == first  # the second trainer timed nothing
    assert plans[0] == plans[1]  # and planned from the same times
