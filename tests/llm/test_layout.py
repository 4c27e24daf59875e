"""Run directories: one per store directory, all removed together; the store gets them as one root string."""
import shutil

import pytest

from terastack.llm import TrainerConfig
from terastack.llm.engine import store_layout as layout


def test_several_store_directories(tmp_path):
    dirs = [tmp_path / "ssd0", tmp_path / "ssd1"]
    cfg = TrainerConfig(store_dir=[str(d) for d in dirs])
    assert cfg.store_dir == f"{dirs[0]},{dirs[1]}"  # a list is kept as the comma-separated string
    assert TrainerConfig(store_dir=cfg.store_dir).store_dir == cfg.store_dir
    run_dirs = layout.make_run_dirs(cfg.store_dir, 0)
    assert [d.parent for d in run_dirs] == dirs and run_dirs[0].name == run_dirs[1].name
    assert layout.store_root(run_dirs) == f"{run_dirs[0]},{run_dirs[1]}"
    layout.remove_run_dirs(run_dirs)
    assert not any(d.exists() for d in run_dirs)


def test_free_space_counts_each_file_system_once(tmp_path, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20))
    # two directories on one file system: 1 MiB free, not 2
    with pytest.raises(OSError, match="has 1.00 MiB free"):
        layout.make_run_dirs(f"{tmp_path / 'a'},{tmp_path / 'b'}", 3 << 19)
    assert not list((tmp_path / "a").iterdir()) and not list((tmp_path / "b").iterdir())  # nothing left behind


@pytest.mark.parametrize("bad", ["a,,b", ","])
def test_empty_directory_in_the_list_is_refused(bad):
    with pytest.raises(ValueError, match="store_dir"):
        TrainerConfig(store_dir=bad)


def test_ssd_space_of_a_plan_covers_what_training_uses(trainer_config):
    """Eager updates never spill a gradient (backward waits for room in the gradient pool), so the space a
    plan asks of the disk is 12 bytes a trainable parameter plus swapped activations -- and the store never
    uses more than that while training with its state on the SSD."""
    from terastack.llm import Trainer
    from terastack.llm.engine import store_layout as layout

    from .llm_helpers import batches, tiny_config

    with Trainer.from_config(tiny_config("llama", layers=2),
                             trainer_config(state_placement="ssd", activation_policy="ssd")) as trainer:
        assert trainer.plan.optimizer_schedule == "eager"
        need = layout.ssd_bytes_needed(trainer.profile, trainer.plan)
        trainable = sum(t.numel for t in trainer.tensors.values() if t.trainable)
        acts = sum(u.act_bytes for u, p in zip(trainer.profile.units, trainer.plan.policies) if p == "ssd")
        assert need == 12 * trainable + acts
        for ids in batches(3):
            trainer.step(ids)
        trainer.synchronize()
        assert not [n for n in trainer.store.names() if n.startswith("g:")]  # no gradient went to the SSD
        assert trainer.store.usage()["ssd"]["live"] <= need
