"""The ZeRO-Infinity contender of ``terastack bench llm`` and ``bench llm-scale``: DeepSpeed ZeRO-3 with its
parameters and optimizer state offloaded to NVMe, configured as its users configure it for the model at hand.

[Note: ZeRO-Infinity configured for the model]
DeepSpeed's parameter swapper moves each parameter between the NVMe and a pool of ``buffer_count`` host buffers
of ``buffer_size`` elements, one parameter per buffer whatever its size; ``max_in_cpu`` parameter elements stay in
host memory instead (DeepSpeed's default, 1e9, keeps every parameter of a model below a billion there). Sized
from the model, as DeepSpeed's documentation and its error messages direct a user:

- ``buffer_size``: the model's largest parameter (DeepSpeed refuses a parameter larger than a buffer);
- ``stage3_max_reuse_distance``: when parameters swap from the NVMe, one buffer's worth, so a parameter is
  released after its module runs unless it is needed again that soon. DeepSpeed's default distance, 1e9
  elements, keeps nearly every parameter of a 1.1B model in its buffer and the pool runs dry ("Not enough buffers
  0 for swapping 1", the assertion that ended the ladder of 2026-12-05 at 1.1B); with parameters in host memory
  the default stays;
- ``buffer_count``: DeepSpeed's 5, enough once parameters are released after use (1.1B ran with it, peak RSS 13.6
  GiB, most of it the fp32 gradients ZeRO-3 keeps in host memory for its CPU optimizer), and every buffer more is
  host memory the ladder would count against it;
- ``max_in_cpu``: the caller's (:func:`ds_config`): DeepSpeed's default for the throughput comparison, where a
  user keeps what fits in host memory, and 0 for the ladder of the largest model in a fixed memory, where a user
  puts every parameter on the NVMe.

A run that fails for any other reason than memory leaves the largest model unmeasured
(terastack.llm.bench.ladder_summary), never "does not fit".
"""
from __future__ import annotations

import os
import time

#: DeepSpeed's own defaults, kept where the model does not call for another value
DEFAULT_BUFFER_COUNT = 5
DEFAULT_MAX_IN_CPU = 10**9
DEFAULT_REUSE_DISTANCE = 10**9
#: the swapper aligns each buffer to this many elements (the aio block over an fp32 element, with room to spare)
_ALIGN = 1 << 20


def model_shape(hf_config) -> tuple[int, int]:
    """(the model's parameters, its largest parameter's elements)."""
    from terastack.training.hf.model_files import build_skeleton

    sizes = [p.numel() for p in build_skeleton(hf_config).parameters()]   # meta: no memory
    return sum(sizes), max(sizes)


def offload_sizes(params: int, largest: int, max_in_cpu: int) -> dict:
    """The parameter swapper's sizes for a model ([Note: ZeRO-Infinity configured for the model])."""
    buffer = -(-max(largest, _ALIGN) // _ALIGN) * _ALIGN
    swapped = params > max_in_cpu
    return {"buffer_size": buffer, "buffer_count": DEFAULT_BUFFER_COUNT,
            "reuse_distance": buffer if swapped else DEFAULT_REUSE_DISTANCE}


def ds_config(args, hf_config, *, max_in_cpu: int = DEFAULT_MAX_IN_CPU) -> dict:
    """The DeepSpeed configuration of the contender for ``args`` (a bench worker's) and the model."""
    nvme = os.path.join(args.dir, "zero-infinity")
    os.makedirs(nvme, exist_ok=True)
    params, largest = model_shape(hf_config)
    sizes = offload_sizes(params, largest, max_in_cpu)
    buffer = sizes["buffer_size"]
    return {
        "train_micro_batch_size_per_gpu": args.batch_size, "gradient_accumulation_steps": args.grad_accum,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                    "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": nvme, "pin_memory": False, "buffer_size": buffer,
                              "buffer_count": sizes["buffer_count"], "max_in_cpu": max_in_cpu},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": False, "buffer_count": 4},
            "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": buffer,
            "stage3_max_reuse_distance": sizes["reuse_distance"], "stage3_prefetch_bucket_size": buffer // 2,
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
    zero = config["zero_optimization"]
    out.update(setup_s=setup, deepspeed=deepspeed.__version__,
               offload_param={**{k: zero["offload_param"][k] for k in ("buffer_count", "buffer_size", "max_in_cpu")},
                              "stage3_max_reuse_distance": zero["stage3_max_reuse_distance"]})
    return out
