"""The weights and optimizer state of a :class:`~terastack.llm.trainer.Trainer`, read back under the model's own
parameter names (a sliced embedding or head is joined from its parts: [Note: vocabulary slices] in
terastack.llm.vocab_slices)."""
from __future__ import annotations

import dataclasses

import torch

from terastack.llm.engine import records


class TrainerWeights:
    """Reading weights back, for :class:`~terastack.llm.trainer.Trainer` (which provides ``tensors``, ``slicing``,
    the runtime, the optimizer, ``synchronize`` and the open check)."""

    def model_tensors(self) -> dict:
        """The model's parameters by its own names (name -> TensorInfo): the engine's, with each sliced one as the
        whole tensor its parts make."""
        out = {}
        for name, info in sorted(self.tensors.items(), key=lambda kv: kv[1].index):
            whole = self.slicing.whole_name(name)
            if whole == name:
                out[name] = info
            elif whole not in out:
                parts = [self.tensors[p] for p in self.slicing.parts[whole]]
                shape = (sum(p.shape[0] for p in parts), *info.shape[1:])
                out[whole] = dataclasses.replace(info, name=whole, shape=shape, users=[])
        return out

    def parameter(self, name: str) -> torch.Tensor:
        """A copy of parameter ``name`` (fp32 master if it trains, else its stored weight), by the model's name."""
        self._check_open()
        self.synchronize()
        if name not in self.tensors and name not in self.slicing.parts:
            raise KeyError(f"no parameter named {name!r}")
        return self.slicing.join(name, self._engine_parameter)

    def _engine_parameter(self, name: str) -> torch.Tensor:
        info = self.tensors[name]
        rt = self.runtime
        if info.trainable:
            parts = [rt.read_record(r).reshape(-1) for r in rt.master_records(name)]
            return torch.cat(parts).view(info.shape) if len(parts) > 1 else parts[0].view(info.shape)
        return rt.compute_weight(name, rt.read_record(records.compute(name))).to(torch.float32)

    def named_parameters(self):
        """(name, fp32 copy) for every parameter, one at a time, by the model's names."""
        for name in self.model_tensors():
            yield name, self.parameter(name)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter as an fp32 copy (small models only: it materializes the whole model)."""
        return dict(self.named_parameters())

    def optimizer_state(self, name: str) -> dict:
        """The optimizer state of trainable parameter ``name`` in its format's own terms, as the format's reference
        library keeps it for the parameter (``optimizer.state[p]``; copies): ``step`` (the updates made, an int)
        and the format's parts in their library shapes and dtypes -- AdamW's ``exp_avg`` and ``exp_avg_sq``;
        AdamW8bit's ``state1`` and ``state2`` (uint8) with ``absmax1``, ``absmax2``, ``qmap1`` and ``qmap2``
        (fp32 ``state1``/``state2`` only, under ``min_8bit_size``); Adafactor's ``row_var`` and ``col_var`` (a
        vector: ``variance``)."""
        self._check_open()
        names = self.slicing.parts.get(name, [name])
        if any(n not in self.tensors or not self.tensors[n].trainable for n in names):
            raise KeyError(f"no trainable parameter named {name!r} (only those have optimizer state)")
        self.synchronize()
        states = [self._engine_optimizer_state(n) for n in names]
        # a sliced parameter's parts hold whole blocks of its rows: their state side by side is the whole's
        return {key: (value if key == "step" or key.startswith("qmap") or len(states) == 1
                      else torch.cat([s[key] for s in states], dim=0))
                for key, value in states[0].items()}

    def _engine_optimizer_state(self, name: str) -> dict:
        info = self.tensors[name]
        rt = self.runtime
        parts = {part.key: torch.cat([rt.read_record(r).reshape(-1) for r in recs]).view(part.shape(info.shape))
                 for part, recs in rt.state_parts(name).items()}
        return {"step": self.optimizer.steps[name], **self.optimizer.format.library_state(parts)}
