"""The process-group backend follows the device, and NCCL (no tags) is refused for tagged messages."""
import pytest
import torch

from terastack.disdp.comm import Comm, backend_for
from terastack.disdp.roles import RoleMap


def test_backend_follows_the_device():
    assert backend_for("cpu") == "gloo"
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for("cuda") == "nccl"
    assert backend_for("cuda:1") == "nccl"
    with pytest.raises(ValueError, match="device"):
        backend_for("meta")


def test_tagged_messages_are_refused_on_nccl():
    with pytest.raises(ValueError, match="no tags"):
        Comm(None, 0, timeout_s=1.0, backend="nccl")
    assert Comm(RoleMap(workers=1, servers=1), 0, timeout_s=1.0, backend="gloo").backend == "gloo"
