"""The model a Trainer holds, made the offloaded engine's skeleton, and where its weights come from.

[Note: the Trainer's model is the skeleton]
The engine trains the very model object the Trainer holds (``trainer.model``), so everything the Trainer and TRL
do with it afterwards -- ``model(**inputs)`` in evaluation, ``model.config``, callbacks -- reaches the streamed
model. Its parameters move to the meta device (ties and ``requires_grad`` kept: a peft model's frozen base stays
frozen), and its weights reach the store one tensor at a time from where they were:

* a model in memory (``from_pretrained``, or built from a config): its own tensors, taken off it (the memory
  they held is freed as each reaches the store, unless the caller keeps other references to them);
* an empty model (:func:`terastack.hf.empty_model`): its checkpoint files, through transformers' key conversions,
  as ``terastack finetune`` reads them; a peft model over it takes its adapters' initial values from peft's own
  initialization under the run's seed (the base's parameters are meta, so peft drew none). A directory with a
  config and no weights is a random initialization under the run's seed, written straight to the store, as
  ``terastack finetune --model DIR`` makes it for such a directory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

#: an empty model carries its checkpoint directory under this attribute (set by terastack.hf.empty_model)
SOURCE_ATTR = "_terastack_checkpoint"
#: ... and the LoRA base format its quantization_config asked for
BASE_FORMAT_ATTR = "_terastack_base_format"


@dataclass(kw_only=True, slots=True)
class ModelSource:
    """The engine's model: ``model`` (the Trainer's, peft-wrapped or not), ``causal_lm`` (the transformers model
    inside, whose forward computes the loss), and its weights: ``tensors`` (canonical name -> tensor, taken off a
    model in memory) or ``reader`` and ``keys`` (an empty model's checkpoint files)."""

    model: nn.Module
    causal_lm: nn.Module
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    #: (module, parameter name, the parameter as it was) of a model in memory: put back if offload fails
    taken: list = field(default_factory=list)
    #: (module, child name, the child as it was) of every module, and the model's own forward attribute: the
    #: engine puts stand-ins into the model (its units, vocabulary slices), taken out again if offload fails
    tree: list = field(default_factory=list)
    forward: object = None
    reader: object = None
    keys: object = None
    checkpoint_dir: str | None = None

    @property
    def hf_config(self):
        return self.causal_lm.config

    def restore(self) -> None:
        """Put the model back as it was (``offload`` failed after taking its weights: nothing is lost)."""
        for mod, name, child in self.tree:
            mod._modules[name] = child
        if self.forward is None:
            self.model.__dict__.pop("forward", None)
        else:
            self.model.forward = self.forward
        for mod, pname, p in self.taken:
            mod._parameters[pname] = p
        self.taken.clear()

    def keep(self) -> None:
        """``offload`` succeeded: let go of what :meth:`restore` would put back."""
        self.taken.clear()
        self.tree.clear()



def causal_lm_of(model: nn.Module) -> nn.Module:
    """The transformers causal LM inside ``model`` (a PreTrainedModel, or a peft model over one)."""
    from transformers import PreTrainedModel

    inner = model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model
    if not isinstance(inner, PreTrainedModel) or not hasattr(inner, "get_output_embeddings"):
        raise ValueError(f"terastack.hf.offload: the Trainer's model is a {type(model).__name__}; served: a "
                         "transformers causal LM (AutoModelForCausalLM), or a peft LoRA model over one")
    if getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False):
        raise ValueError("terastack.hf.offload: a bitsandbytes-quantized model in memory; give "
                         "terastack.hf.empty_model(path) and offload(..., base_format='nf4') for a QLoRA base")
    return inner


def take_weights(model: nn.Module) -> tuple[dict[str, torch.Tensor], list]:
    """Every parameter of ``model`` by its canonical name (the first of ``named_parameters``), the model's own
    parameters replaced by meta ones (ties and ``requires_grad`` kept); and what was replaced, to put back."""
    out = {name: p.detach() for name, p in model.named_parameters()}
    meta: dict[int, nn.Parameter] = {}
    taken = []
    for mod in model.modules():
        for pname, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in meta:
                meta[id(p)] = nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)
            taken.append((mod, pname, p))
            mod._parameters[pname] = meta[id(p)]
    return out, taken


def model_source(model: nn.Module) -> ModelSource:
    """The engine's model and its weights ([Note: the Trainer's model is the skeleton])."""
    from terastack.training.hf.keys import CheckpointKeys
    from terastack.training.hf.model_files import CheckpointReader, build_skeleton

    causal_lm = causal_lm_of(model)
    path = getattr(causal_lm, SOURCE_ATTR, None)
    shape = dict(tree=[(m, name, child) for m in model.modules() for name, child in m._modules.items()],
                 forward=model.__dict__.get("forward"))
    if path is None:
        meta = [n for n, p in model.named_parameters() if p.device.type == "meta"]
        if meta:
            raise ValueError(f"terastack.hf.offload: parameter {meta[0]!r} has no data (a meta tensor) and the model "
                             "is not a terastack.hf.empty_model; build it with empty_model(path) or load its weights")
        tensors, taken = take_weights(model)
        return ModelSource(model=model, causal_lm=causal_lm, tensors=tensors, taken=taken, **shape)
    if not has_weights(path):  # a config alone: a random initialization, in the store
        return ModelSource(model=model, causal_lm=causal_lm, checkpoint_dir=str(path), **shape)
    reader = CheckpointReader.of_model(path, causal_lm.config)
    # the keys are decided on an unwrapped skeleton, as finetune decides them ([Note: checkpoint keys])
    keys = CheckpointKeys(build_skeleton(causal_lm.config), reader.keys())
    return ModelSource(model=model, causal_lm=causal_lm, reader=reader, keys=keys, checkpoint_dir=str(path), **shape)


def has_weights(path) -> bool:
    """Whether the model directory ``path`` holds weights (safetensors, or pickled files CheckpointReader refuses by
    name) rather than a config alone."""
    from pathlib import Path

    return any(Path(path).glob("*.safetensors")) or any(Path(path).glob("*.safetensors.index.json")) or any(
        Path(path).glob("*.bin"))


def draws_dropout(model: nn.Module) -> bool:
    """Whether ``model``'s training forward draws random numbers: a dropout module, or a config's dropout
    probability (attention dropout, which the attention kernel draws), above zero.

    [Note: the Trainer's order of micro-batches]
    The engine's vertical order runs the micro-batches of a step stacked into one batch: each layer's weights are
    read once a step, and the step is the plain one on the stacked batch. Two things a Trainer's run depends on
    change with it. A dropout layer draws one mask for all the micro-batches, where the Trainer draws one per
    micro-batch (the same distribution, other numbers). And a weight's gradient comes out of one matmul over all
    the rows instead of one per micro-batch added up: equal up to the order of float sums, which 8-bit moments
    can turn into a neighbouring quantization level (1e-4 apart in the tests). So for a model that draws dropout,
    and under ``adamw_bnb_8bit``, ``offload`` takes the horizontal order unless ``accumulation`` is given, and the
    run equals the Trainer's own, draw for draw and byte for byte (recomputed units replay their draws: [Note:
    recomputation and randomness] in terastack.llm.engine.streamed_units); ``accumulation="vertical"`` trades
    that for the weights read once a step."""
    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    if any(isinstance(m, kinds) and m.p > 0 for m in model.modules()):
        return True
    config = causal_lm_of(model).config.get_text_config()
    return any(isinstance(v, float) and v > 0 and ("dropout" in k or "pdrop" in k) for k, v in vars(config).items())
