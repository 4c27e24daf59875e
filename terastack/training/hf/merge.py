"""``terastack merge``: a peft LoRA adapter merged into its base model, written as a full model transformers loads.

    terastack merge --base /models/llama --adapter /runs/adapter --output /models/llama-merged \\
        [--dtype bfloat16] [--max-shard-size 5GB]

[Note: merging an adapter]
For each module the adapter adapts, ``W' = W + scaling * B @ A`` -- peft's ``get_delta_weight``: the product
is transposed for ``fan_in_fan_out`` layers (GPT-2's ``Conv1D``) and for embeddings, and
``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA), r and alpha per module from
``rank_pattern`` / ``alpha_pattern`` as peft reads them. The update is computed in fp32 and the sum cast to the
output dtype (the base tensor's own, or ``--dtype`` for floating tensors). Adapter options that change this
formula or need more than A and B (DoRA, LoRA biases, ``modules_to_save``, initializations that rewrite the base
weights, ...) are refused by name, never merged approximately.

The base model is never whole in memory: its tensors are read one at a time (``safetensors.safe_open``; a
sharded base through its index) and written through the sharded writer of the export ([Note: sharded export]).
Its keys are kept as they are in its files: they already are transformers' save-time names. Which file key
holds an adapted module's weight is decided by transformers' own key conversions, as for training ([Note:
checkpoint keys]): GPT-NeoX's ``lm_head`` is ``embed_out.weight`` in the file. Every adapter module is
matched, and every update's shape checked, before the output is begun; the output directory is committed
atomically.

[Note: merging into an NF4 base]
An adapter trained on an NF4 base (``lora.base_format``; its directory holds ``base_format.json``) learned its
update against the dequantized base, so that is what it is merged into: each weight the training quantized
([Note: which weights are NF4] in terastack.training.hf.nf4) is quantized and dequantized by bitsandbytes, one
tensor at a time, before ``W + scaling * B @ A`` -- what peft's ``merge_and_unload`` gives over a model holding the
dequantized weights. A base directory saved 4-bit by bitsandbytes is read dequantized (fp32) and written
unquantized (its ``quantization_config`` dropped). ``--base-format native`` merges into the weights as stored.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from terastack.training.hf import nf4
from terastack.dtypes import SAFETENSORS_DTYPES, WEIGHT_DTYPES, to_dtype
from terastack.training.hf.model_files import CheckpointReader, build_skeleton, load_hf_config
from terastack.training.output_dir import check_apart, check_replaceable
from terastack.training.hf.sharded_writer import (DEFAULT_MAX_SHARD_SIZE, copy_tokenizer_files, shard_limit,
                                          staged_dir, write_safetensors_files)
from terastack.units import format_bytes

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."

#: adapter_config.json fields whose use this merge refuses: the merged weight would need more than W + s * B @ A
_UNSUPPORTED = {
    "use_dora": "DoRA rescales the merged weight by a learned magnitude",
    "lora_bias": "LoRA biases add to the base bias",
    "modules_to_save": "modules trained in full are stored beside the adapter",
    "trainable_token_indices": "trained token embeddings are stored beside the adapter",
    "target_parameters": "LoRA on parameters (stacked MoE experts) is merged differently",
    "layer_replication": "replicated layers change the model's structure",
    "alora_invocation_tokens": "activated LoRA only applies after its invocation tokens",
    "use_qalora": "QA-LoRA pools the input before A",
    "megatron_config": "Megatron parallel layers",
    "arrow_config": "Arrow routes between several adapters",
    "use_bdlora": "block-diagonal LoRA",
    "kasa_config": "KaSA changes the update formula",
    "monteclora_config": "MonteCLoRA samples its update",
}
#: initializations that rewrite the base weights: the adapter belongs to a base that no longer exists on disk
_BASE_REWRITING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


@dataclass(eq=False, slots=True)
class AdaptedModule:
    """One module's A and B in the adapter file and how its update is formed."""

    name: str                   # the module's path in the model, e.g. model.layers.0.self_attn.q_proj
    a_key: str
    b_key: str
    transpose: bool             # fan_in_fan_out layers and embeddings store the weight transposed to B @ A
    scaling: float
    shape: tuple[int, ...] = ()  # the update's shape (checked against the base weight)


class LoraAdapter:
    """A peft LoRA adapter directory: its config checked, its modules listed, their updates computed."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"adapter directory {self.directory} does not exist")
        self.config_path = self.directory / ADAPTER_CONFIG
        self.file = self.directory / ADAPTER_WEIGHTS
        if not self.config_path.is_file():
            raise FileNotFoundError(f"{self.config_path} does not exist: {self.directory} is not a peft adapter "
                                    "directory")
        if not self.file.is_file():
            hint = (" (adapter_model.bin found: pickle files are not read, as loading them can run code)"
                    if (self.directory / "adapter_model.bin").exists() else "")
            raise FileNotFoundError(f"{self.file} does not exist{hint}")
        try:
            self.config = json.loads(self.config_path.read_text())
        except ValueError as exc:
            raise ValueError(f"{self.config_path} is not valid JSON ({exc})") from None
        if not isinstance(self.config, dict):
            raise ValueError(f"{self.config_path}: expected a JSON object")
        self._check_config()
        self.reader = CheckpointReader.of_file(self.file)
        #: base parameter name -> adapter file key of a weight peft stored with the adapter (embedding layers)
        self.saved_weights: dict[str, str] = {}
        self.modules = self._modules()

    def _check_config(self) -> None:
        cfg, where = self.config, self.config_path
        if cfg.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"{where}: peft_type {cfg.get('peft_type')!r}; terastack merge merges LoRA adapters")
        for name, reason in _UNSUPPORTED.items():
            if cfg.get(name):
                raise ValueError(f"{where}: {name} is set ({reason}); terastack merge does not support it")
        if cfg.get("bias", "none") != "none":
            raise ValueError(f"{where}: bias={cfg['bias']!r} (trained biases are stored beside the adapter); "
                             "terastack merge supports bias='none'")
        init = cfg.get("init_lora_weights", True)
        if isinstance(init, str) and init.lower().startswith(_BASE_REWRITING_INITS):
            raise ValueError(f"{where}: init_lora_weights={init!r} rewrote the base weights during training; "
                             "convert the adapter to a plain LoRA with peft (path_initial_model_for_weight_conversion)"
                             " before merging")
        for name in ("r", "lora_alpha"):
            value = cfg.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{where}: {name} must be a positive number, got {value!r}")

    def _modules(self) -> dict[str, AdaptedModule]:
        try:
            from peft.utils.other import get_pattern_key  # how peft itself matches rank_pattern / alpha_pattern
        except ImportError as exc:
            raise ValueError("terastack merge: needs the peft package (pip install 'terastack[llm]')") from exc

        cfg = self.config
        parts: dict[str, dict[str, str]] = {}
        for key in self.reader.keys():
            m = (re.fullmatch(rf"{re.escape(_PREFIX)}(.+)\.(lora_A|lora_B)\.weight", key)
                 or re.fullmatch(rf"{re.escape(_PREFIX)}(.+)\.(lora_embedding_A|lora_embedding_B)", key))
            if m is not None:
                parts.setdefault(m.group(1), {})[m.group(2)] = key
                continue
            # peft saves the embedding layers' own weights beside their adapters (save_embedding_layers) and
            # loads them over the base's: the merge starts from them too
            m = re.fullmatch(rf"{re.escape(_PREFIX)}(.+?)(\.base_layer)?\.weight", key)
            if m is None or ".lora_" in key:
                raise ValueError(f"adapter file {self.file}: tensor {key!r} is neither a LoRA A or B matrix nor a "
                                 "saved base weight; terastack merge merges plain LoRA adapters")
            self.saved_weights[f"{m.group(1)}.weight"] = key
        if not parts:
            raise ValueError(f"adapter file {self.file} holds no LoRA tensors")
        rank_pattern = cfg.get("rank_pattern") or {}
        alpha_pattern = cfg.get("alpha_pattern") or {}
        modules = {}
        for name, found in parts.items():
            embedding = "lora_embedding_A" in found or "lora_embedding_B" in found
            a, b = ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A", "lora_B")
            if a not in found or b not in found:
                raise ValueError(f"adapter file {self.file}: module {name!r} has {sorted(found)[0]} but not "
                                 f"{b if a in found else a}")
            r = rank_pattern.get(get_pattern_key(rank_pattern.keys(), name), cfg["r"])
            alpha = alpha_pattern.get(get_pattern_key(alpha_pattern.keys(), name), cfg["lora_alpha"])
            scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
            a_shape, _ = self.reader.info(found[a])
            b_shape, _ = self.reader.info(found[b])
            if len(a_shape) != 2 or len(b_shape) != 2:
                raise ValueError(f"adapter file {self.file}: {found[a]} has shape {list(a_shape)}; terastack merge "
                                 "merges LoRA on linear and embedding layers")
            if a_shape[0] != r or b_shape[1] != r:
                raise ValueError(f"adapter file {self.file}: module {name!r} has rank {a_shape[0]} (A) and "
                                 f"{b_shape[1]} (B); {self.config_path.name} gives it r={r}")
            transpose = embedding or bool(cfg.get("fan_in_fan_out"))
            update = (b_shape[0], a_shape[1])
            modules[name] = AdaptedModule(name=name, a_key=found[a], b_key=found[b], transpose=transpose,
                                          scaling=scaling, shape=update[::-1] if transpose else update)
        return modules

    def delta(self, module: AdaptedModule) -> torch.Tensor:
        """``scaling * B @ A`` in fp32 (transposed where peft transposes it)."""
        a = self.reader.get(module.a_key).to(torch.float32)
        b = self.reader.get(module.b_key).to(torch.float32)
        product = b @ a
        return (product.T if module.transpose else product) * module.scaling


def weight_keys(base: CheckpointReader, hf_config) -> tuple[dict[str, list[str]], set[str]]:
    """{parameter name: the base file keys holding it} for parameters stored as they are (renamed at most), and
    the names of parameters transformers builds by converting several file tensors (stacked experts)."""
    from terastack.training.hf.keys import load_groups

    skeleton = build_skeleton(hf_config)
    groups, _ = load_groups(skeleton, base.keys())
    plain: dict[str, list[str]] = {}
    converted = set()
    for group in groups:
        if group.converter:
            converted.add(group.first)
        else:
            plain.setdefault(group.first, []).extend(group.sources)
    return plain, converted


@dataclass(kw_only=True, slots=True)
class MergeResult:
    output: Path
    modules: int
    files: list[str]
    bytes: int
    updated_keys: list[str] = field(default_factory=list)


def merge_base(base: Path, adapter: Path, hf_config, plain: dict[str, list[str]], base_format: str) -> set[str]:
    """The base file keys to merge into as NF4-dequantized weights ([Note: merging into an NF4 base]);
    ``base_format``: nf4, native, or auto (what the adapter directory says it was trained on)."""
    if base_format not in ("auto", "nf4", "native"):
        raise ValueError(f"base_format: must be auto, nf4 or native; got {base_format!r}")
    if base_format == "auto":
        marker = adapter / nf4.BASE_FORMAT_FILE
        try:
            trained = json.loads(marker.read_text()).get("base_format") if marker.exists() else "native"
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"adapter file {marker} is unreadable ({exc})") from None
        base_format = "nf4" if trained == "nf4" else "native"
    if base_format != "nf4" or nf4.quantized_format(base) is not None:
        return set()  # native, or a 4-bit base: its weights are read dequantized already
    return {k for name in nf4.linear_weights(build_skeleton(hf_config)) for k in plain.get(name, ())}


def merge_adapter(base: str | Path, adapter: str | Path, output: str | Path, *, dtype: str | None = None,
                  max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, base_format: str = "auto") -> MergeResult:
    """Merge the LoRA ``adapter`` directory into the model in ``base`` and write the full model into ``output``.
    See [Note: merging an adapter] and [Note: merging into an NF4 base]."""
    base, adapter, output = Path(base), Path(adapter), Path(output)
    target = None
    if dtype is not None:
        target = to_dtype(dtype, allowed=WEIGHT_DTYPES)
    limit = shard_limit(max_shard_size)
    check_apart(output, {"--base": base, "--adapter": adapter})
    check_replaceable(output)  # before any work: a directory of the user's own files is never replaced
    lora = LoraAdapter(adapter)
    hf_config = load_hf_config(base)
    reader = CheckpointReader(base)
    if nf4.quantized_format(base) is not None:
        reader = nf4.DequantizingReader(reader)
    plain, converted = weight_keys(reader, hf_config)
    rounded = merge_base(base, adapter, hf_config, plain, base_format)
    def base_keys(param: str, what: str) -> list[str]:
        if param in converted:
            raise ValueError(f"adapter file {lora.file}: {what} {param!r} is stored in {base} as several tensors "
                             "transformers converts on load; terastack merge cannot update it")
        keys = plain.get(param)
        if not keys:
            raise ValueError(f"adapter file {lora.file}: {what} has no weight {param!r} in the base model {base} "
                             "(an adapter of another model, or a tied weight?)")
        return keys

    updates: dict[str, AdaptedModule] = {}      # base file key -> the module whose update it receives
    for module in lora.modules.values():
        for key in base_keys(f"{module.name}.weight", f"module {module.name!r}"):
            shape, _ = reader.info(key)
            if tuple(shape) != tuple(module.shape):
                raise ValueError(f"adapter file {lora.file}: module {module.name!r} makes a {list(module.shape)} "
                                 f"update; {key} in {reader.files[key]} is {list(shape)} (an adapter of another "
                                 "model size?)")
            updates[key] = module
    replaced: dict[str, str] = {}               # base file key -> adapter file key of the weight peft loads over it
    for param, saved in lora.saved_weights.items():
        for key in base_keys(param, f"saved weight {saved!r}"):
            if tuple(lora.reader.info(saved)[0]) != tuple(reader.info(key)[0]):
                raise ValueError(f"adapter file {lora.file}: {saved} has shape {list(lora.reader.info(saved)[0])}, "
                                 f"{key} in {reader.files[key]} is {list(reader.info(key)[0])} (a resized "
                                 "vocabulary is not supported)")
            replaced[key] = saved
    groups = []
    for key in reader.keys():
        shape, st_dtype = reader.info(key)
        stored = SAFETENSORS_DTYPES.get(st_dtype)
        if stored is None:
            raise ValueError(f"checkpoint file {reader.files[key]}: tensor {key!r} has dtype {st_dtype}, which "
                             "terastack merge does not write")
        out_dtype = target if target is not None and stored.is_floating_point else stored
        groups.append(({key: (tuple(shape), out_dtype)},
                       lambda k=key: {k: _merged(reader, lora, updates, replaced, k, rounded)}))
    with staged_dir(output) as tmp:
        weight_map = write_safetensors_files(tmp, groups, max_shard_size=limit)
        _write_config(base / "config.json", tmp / "config.json", dtype)  # unquantized, always
        copy_tokenizer_files(base, tmp)
        files = sorted(set(weight_map.values()))
        size = sum((tmp / f).stat().st_size for f in files)
    reader.close()
    return MergeResult(output=output, modules=len(lora.modules), files=files, bytes=size,
                       updated_keys=sorted(updates))


def _merged(reader: CheckpointReader, lora: LoraAdapter, updates: dict[str, AdaptedModule],
            replaced: dict[str, str], key: str, rounded: set[str]) -> torch.Tensor:
    weight = lora.reader.get(replaced[key]) if key in replaced else reader.get(key)
    if key in rounded:  # [Note: merging into an NF4 base]
        weight = nf4.decode(nf4.encode(weight), tuple(weight.shape), torch.float32)  # cast by the writer
    module = updates.get(key)
    if module is None:
        return weight
    return weight.to(torch.float32) + lora.delta(module)    # cast to the output dtype by the writer


def _write_config(source: Path, dest: Path, dtype: str | None) -> None:
    """The base's config.json, with the dtype field naming ``dtype`` when the weights were cast to it."""
    cfg = json.loads(source.read_text())
    cfg.pop("quantization_config", None)  # a 4-bit base is written dequantized
    if dtype is not None:
        cfg["dtype"] = dtype
        if "torch_dtype" in cfg:
            cfg["torch_dtype"] = dtype
    dest.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", required=True, metavar="DIR", help="the base model directory (safetensors, sharded "
                   "or not, with config.json)")
    p.add_argument("--adapter", required=True, metavar="DIR", help="a peft LoRA adapter directory "
                   "(adapter_config.json, adapter_model.safetensors)")
    p.add_argument("--output", required=True, metavar="DIR", help="where the merged model is written (replaced "
                   "atomically if it exists)")
    p.add_argument("--dtype", default=None, choices=sorted(WEIGHT_DTYPES),
                   help="cast floating tensors to this dtype (default: each base tensor's own)")
    p.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE,
                   help=f"largest safetensors file before the output is sharded (default {DEFAULT_MAX_SHARD_SIZE})")
    p.add_argument("--base-format", default="auto", choices=("auto", "nf4", "native"),
                   help="the base the adapter was trained on: nf4 (bitsandbytes' 4-bit, merged into the "
                   "dequantized weights), native, or auto (what the adapter directory's base_format.json says)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    result = merge_adapter(args.base, args.adapter, args.output, dtype=args.dtype,
                           max_shard_size=args.max_shard_size, base_format=args.base_format)
    if args.json:
        print(json.dumps({"output": str(result.output), "modules": result.modules, "files": result.files,
                          "bytes": result.bytes}))
    else:
        print(f"merged {result.modules} adapted modules of {args.adapter} into {args.base}: {result.output} "
              f"({len(result.files)} file{'s' if len(result.files) > 1 else ''}, {format_bytes(result.bytes)})")
    return 0
