"""Fixtures of the terastack.hf tests (helpers live in hf_helpers.py)."""
import pytest

from ..described_machine import write_machine


@pytest.fixture
def hardware_file(tmp_path):
    """A fixed machine description: the engine plans for it, without probing this machine."""
    return write_machine(tmp_path / "hw.json")
