"""What a GNN run saves in a checkpoint (terastack.training.checkpoint), as its components: the model, the Adam
optimizer, where the run stands, and the random number generators.

[Note: a GNN run resumed]
A batch is a function of the seed, the epoch and its place in the epoch (terastack.gnn.sampling.sampler [Note:
sampling semantics]) and the caches give the feature file's bytes whatever they hold, so the sampler's random
state is the epoch and the next batch in it: a run resumed at batch j of epoch e samples exactly the batches a
run never stopped samples from there, trains the model and optimizer it saved, and ends with the same weights.
The state also keeps the finished epochs' results and this epoch's losses (a resumed run's result is the whole
run's) and the settings that make the batches and the model; a checkpoint of another job is refused naming the
first that differs.
"""
from __future__ import annotations

import torch


class ModuleState:
    """A torch module's parameters and buffers."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def state_dict(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict({k: v.read() for k, v in state.items()}, strict=True)


class OptimizerState:
    """A torch optimizer: its per-parameter tensors at the top level (``state.<i>.<name>``), the rest as JSON."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def state_dict(self) -> dict:
        state = self.optimizer.state_dict()
        out = {"param_groups": state["param_groups"], "scalars": {}}
        for i, per in state["state"].items():
            for name, value in per.items():
                if isinstance(value, torch.Tensor):
                    out[f"state.{i}.{name}"] = value.detach().cpu()
                else:
                    out["scalars"][f"{i}.{name}"] = value
        return out

    def load_state_dict(self, state: dict) -> None:
        per: dict = {}
        for key, value in state.items():
            if key.startswith("state."):
                i, name = key[len("state."):].split(".", 1)
                per.setdefault(int(i), {})[name] = value.read()
        for key, value in state["scalars"].items():
            i, name = key.split(".", 1)
            per.setdefault(int(i), {})[name] = value
        self.optimizer.load_state_dict({"state": per, "param_groups": state["param_groups"]})


class RunProgress:
    """Where a run stands ([Note: a GNN run resumed]): ``epoch``, ``batch`` (the next one in it), ``trained``
    (batches trained in all), the finished epochs' results and this epoch's losses. ``settings``: what a
    resumed run must share with the one that saved."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.epoch = self.batch = self.trained = 0
        self.epochs: list[dict] = []
        self.losses: list[float] = []

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "trained": self.trained, "epochs": self.epochs,
                "losses": self.losses, "settings": self.settings}

    def load_state_dict(self, state: dict) -> None:
        for key, value in self.settings.items():
            saved = state["settings"].get(key)
            if saved != value:
                raise ValueError(f"resume: the checkpoint was written by a job with {key}={saved!r}, this one has "
                                 f"{value!r}; resume with the same settings, or start a new run")
        self.epoch, self.batch, self.trained = state["epoch"], state["batch"], state["trained"]
        self.epochs, self.losses = list(state["epochs"]), list(state["losses"])
