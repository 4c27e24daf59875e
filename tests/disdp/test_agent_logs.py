"""torchrun's agent keeps its per-rank logs in a directory of each launch's own, removed after the launch: a job
leaves nothing under the temporary directory, and a failed rank is still reported from its record."""
import tempfile

import pytest

from terastack.disdp.launch import JobFailed, launch_ranks
from terastack.disdp.roles import RoleMap

ROLES = RoleMap(workers=1, servers=1, aggregator=False)


def _left(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


def test_a_launch_leaves_no_log_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert launch_ranks(ROLES, "platform", [], world_size=2, timeout_s=60, quiet=True) is False
    assert _left(tmp_path) == []


def test_a_failed_launch_is_reported_and_leaves_no_log_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(JobFailed, match="rank 0|rank 1"):
        launch_ranks(ROLES, "terastack.no_such_module", [], world_size=2, timeout_s=60, quiet=True)
    assert _left(tmp_path) == []
