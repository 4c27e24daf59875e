"""The ZeRO-Infinity contender of ``terastack bench llm`` and ``bench llm-scale``: DeepSpeed ZeRO-3 with its
parameters and optimizer state offloaded to NVMe, configured as its users configure it for the model at hand.

[Note: ZeRO-Infinity configured for the model]
DeepSpeed's parameter swapper moves each parameter between the NVMe and a pool of ``buffer_count`` host buffers
of ``buffer_size`` elements, one parameter per buffer whatever its size; ``max_in_cpu`` parameter elements stay in
host memory instead (DeepSpeed's default, 1e9, keeps every parameter of a model below a billion there). Its
defaults (5 buffers of 1e8 elements) fit neither a small model nor a large one, so they are sized from the model,
as its documentation and its error messages direct a user to:

- ``buffer_size``: the model's largest parameter (DeepSpeed refuses a parameter larger than a buffer);
- ``stage3_max_reuse_distance``, ``stage3_max_live_parameters``, ``sub_group_size``: one buffer's worth, so a
  parameter is released after its module runs unless it is needed again within that many elements (DeepSpeed's
  default distance, 1e9 elements, keeps nearly every parameter of a 1.1B model in its buffer, and the pool runs
  dry: "Not enough buffers 0 for swapping 1");
- ``buffer_count``: the parameters one decoder layer holds, twice (the layer in use and the next, prefetched),
  plus the two the layers' neighbours hold at once (the embedding and the head), and never below DeepSpeed's 5;
- ``max_in_cpu``: the caller's (:func:`ds_config`): DeepSpeed's default for the throughput comparison, where a
  user keeps what fits in host memory, and 0 for the ladder of the largest model in a fixed memory, where a user
  puts every parameter on the NVMe.

A run that fails for any other reason than memory leaves the largest model unmeasured
(terastack.llm.bench.bench_scale's ``classify``), never "does not fit".
"""
from __future__ import annotations

import os
import time

#: DeepSpeed's own defaults, kept where the model does not call for another value
DEFAULT_BUFFER_COUNT = 5
DEFAULT_MAX_IN_CPU = 10**9
#: the swapper aligns each buffer to this many elements (the aio block over an fp32 element, with room to spare)
_ALIGN = 1 << 20


def model_shape(hf_config) -> tuple[int, int]:
    """(the largest parameter's elements, the most parameters one repeated layer holds) of the model."""
    import torch

    from terastack.training.hf.model_files import build_skeleton

    skeleton = build_skeleton(hf_config)   # meta: no memory
    largest = max(p.numel() for p in skeleton.parameters())
    layers = max((m for m in skeleton.modules() if isinstance(m, torch.nn.ModuleList)), key=len, default=None)
    per_layer = max((sum(1 for _ in layer.parameters()) for layer in layers), default=1) if layers else 1
    return largest, per_layer


def offload_sizes(largest: int, per_layer: int) -> dict:
    """The parameter swapper's sizes for a model ([Note: ZeRO-Infinity configured for the model])."""
    buffer = -(-max(largest, _ALIGN) // _ALIGN) * _ALIGN
    return {"buffer_size": buffer, "buffer_count": max(DEFAULT_BUFFER_COUNT, 2 * per_layer + 2)}


def ds_config(args, hf_config, *, max_in_cpu: int = DEFAULT_MAX_IN_CPU) -> dict:
    """The DeepSpeed configuration of the contender for ``args`` (a bench worker's) and the model."""
    nvme = os.path.join(args.dir, "zero-infinity")
    os.makedirs(nvme, exist_ok=True)
    largest, per_layer = model_shape(hf_config)
    sizes = offload_sizes(largest, per_layer)
    buffer = sizes["buffer_size"]
    return {
        "train_micro_batch_size_per_gpu": args.batch_size, "gradient_accumulation_steps": args.grad_accum,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                    "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": nvme, "pin_memory": False, **sizes,
                              "max_in_cpu": max_in_cpu},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": False, "buffer_count": 4},
            "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": buffer,
            "stage3_max_reuse_distance": buffer, "stage3_prefetch_bucket_size": buffer // 2,
            "sub_group_size": buffer,
        },
        "aio": {"block_size": 1048576, "queue_depth": 16, "thread_count": 2, "single_submit": False,
                "overlap_events": True},
        "steps_per_print": 1 << 30, "wall_clock_breakdown": False,
    }


def run(args, hf_config, rss, measure, batches) -> dict:
    """Train with ZeRO-Infinity: ``measure(step, batches, warmup, rss)`` times the steps (the bench worker's)."""
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # one local process: loopback only
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import deepspeed
    from transformers import AutoModelForCausalLM

    deepspeed.init_distributed(dist_backend="gloo")
    max_in_cpu = DEFAULT_MAX_IN_CPU if args.zero_max_in_cpu is None else args.zero_max_in_cpu
    config = ds_config(args, hf_config, max_in_cpu=max_in_cpu)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    with deepspeed.zero.Init(config_dict_or_path=config, remote_device="nvme"):
        model = AutoModelForCausalLM.from_config(hf_config)
    model.train()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    setup = time.perf_counter() - t0

    def step(ids):
        micro = ids if isinstance(ids, list) else [ids]
        total = 0.0
        for part in micro:  # DeepSpeed scales the loss and steps the optimizer at the accumulation boundary
            out = engine(input_ids=part, labels=part, use_cache=False)
            engine.backward(out.loss)
            engine.step()
            total += float(out.loss) / len(micro)
        return total
    out = measure(step, batches, args.warmup, rss)
    offload = config["zero_optimization"]["offload_param"]
    out.update(setup_s=setup, deepspeed=deepspeed.__version__,
               offload_param={k: offload[k] for k in ("buffer_count", "buffer_size", "max_in_cpu")})
    return out
