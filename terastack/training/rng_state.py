"""The process's random number generators as a checkpoint component: dropout draws continue after a resume as
they would have without one."""
from __future__ import annotations

import base64
from collections.abc import Mapping

import torch


def rng_states() -> dict:
    """The process's torch generators now: ``{"cpu": state}``, with ``"cuda": [state per device]`` once CUDA is
    initialized (as ``torch.get_rng_state`` and ``torch.cuda.get_rng_state_all`` return them)."""
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_states(states: Mapping) -> None:
    """Restore what :func:`rng_states` returned; a machine with fewer accelerators than the writer's restores
    those it has."""
    torch.set_rng_state(states["cpu"])
    if states.get("cuda") and torch.cuda.is_available():
        for index, saved in enumerate(states["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(saved, index)


class RNGState:
    """The process's torch random number generators (CPU, and CUDA's once initialized): dropout draws.
    ``states``: save these instead of the current ones (as :func:`rng_states` returns them), e.g. as they were
    when a step began."""

    def __init__(self, states: Mapping | None = None):
        self.states = states

    def state_dict(self) -> dict:
        states = rng_states() if self.states is None else self.states
        return {"cpu": _b64(states["cpu"]), **({"cuda": [_b64(s) for s in states["cuda"]]}
                                               if states.get("cuda") else {})}

    def load_state_dict(self, state: dict) -> None:
        set_rng_states({"cpu": _unb64(state["cpu"]), "cuda": [_unb64(s) for s in state.get("cuda") or []]})


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
