"""The census of what a worker holds beyond its model ([Note: state a worker holds]): optimizer state is counted
however it is held; the model's own parameters, gradients and buffers, and what was there before, are not."""
import numpy as np
import torch

from terastack.disdp.held_state import StateCensus

# numpy.random makes its global generator's tables when it is first imported (numpy imports it lazily): here, before
# any census, as a worker's libraries have by the time its census starts
np.random.default_rng(0)


class HandRolledAdam:
    """Moments of its own, in a dict of tensors and a tuple of numpy arrays: no torch.optim anywhere."""

    def __init__(self, params):
        self.moments = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for p in params}
        self.extra = (np.zeros(64, dtype=np.float32),)


def test_a_hand_rolled_optimizers_state_is_counted_and_the_model_is_not():
    """(torch.optim's moments: FSDP2's and ZeRO-3's workers in tests/disdp/test_bench.py)"""
    before = torch.ones(1000)                               # made before the census: a library's table, say
    census = StateCensus()
    model = torch.nn.Linear(32, 16)
    model.register_buffer("scale", torch.ones(16))
    model(torch.randn(4, 32)).sum().backward()            # gradients: the model's own
    assert census.held_beyond_model()["bytes"] == 0
    opt = HandRolledAdam(list(model.parameters()))
    held = census.held_beyond_model()
    assert held["bytes"] == 2 * 4 * (32 * 16 + 16) + 64 * 4
    assert {item["kind"] for item in held["largest"]} == {"Tensor", "ndarray"}
    del opt
    assert census.held_beyond_model()["bytes"] == 0
    assert before.numel() == 1000                           # alive throughout, never counted
