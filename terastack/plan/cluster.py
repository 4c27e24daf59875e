"""Cluster step-time model: standard model-sharded data parallelism (MSDP) vs the disaggregated design.

Answers paper-scale questions (175B on 8 GPUs) as a *prediction*, with every
assumption stated and every per-op cost either measured on this machine or
labelled as assumed. ``terastack dist simulate`` prints it.

[Note: what each design pays per step]
Both designs train P parameters on N GPUs, bf16 on the wire (2 bytes/param),
fp32 master weights and AdamW moments on SSD (24 bytes/param read+written).

MSDP (ZeRO-3 with the optimizer offloaded to each node's NVMe, as ZeRO-Infinity):
  forward/backward   max(T_comp * (1 + interference), T_coll) + T_coll / L
                     (collectives run on the GPU beside the matmuls and slow them by
                     ``interference``; the first layer's gather is never hidden)
  T_coll             3 ring collectives (all-gather fwd, all-gather bwd, reduce-scatter) of 2P bytes:
                     3 * 2P * (N-1)/N bytes per GPU per direction over its NIC
  optimizer          after the backward, serialized with it: each GPU's P/N parameters cross the node's
                     SSDs (26 B/param incl. the bf16 copy) and its share of the node's CPU cores (AdamW)

Disaggregated (workers + per-worker agents + aggregator + S parameter servers):
  worker             T_comp, no interference (collectives run on the agent / NIC)
  worker NIC         receives 2P twice (forward, backward refetch), sends 2P: 4P bytes on the busier direction
  server s           ingress 2P/S (aggregated gradients), egress 4P/S (parameters, replicated by the switch),
                     SSD 24 B/param and AdamW on its P/S parameters — all overlapped with the workers'
                     backward, bucket by bucket
  step               max(T_comp, T_nic, T_server) + one bucket's fetch (fill) + one bucket's update (drain)
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field

import torch

from terastack.reporting import dumps

GB = 1e9

#: name -> (parameters, layers, hidden size, sequence length)
MODELS = {
    "1.3b": (1.3e9, 24, 2048, 2048),
    "7b": (6.7e9, 32, 4096, 2048),
    "13b": (13e9, 40, 5120, 2048),
    "30b": (30e9, 48, 7168, 2048),
    "70b": (70e9, 80, 8192, 2048),
    "175b": (175e9, 96, 12288, 2048),
}


@dataclass(kw_only=True, slots=True)
class ModelShape:
    name: str
    params: float
    layers: int
    hidden: int
    seq_len: int

    @classmethod
    def resolve(cls, spec: str) -> "ModelShape":
        key = spec.lower()
        if key in MODELS:
            p, l, h, s = MODELS[key]
            return cls(name=key, params=p, layers=l, hidden=h, seq_len=s)
        path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
        if not os.path.isfile(path):
            raise ValueError(f"model: {spec!r} is neither a known size ({', '.join(MODELS)}) nor a config.json")
        with open(path) as f:
            cfg = json.load(f)
        try:
            h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"model config {path}: missing or bad field {exc}") from None
        ffn = int(cfg.get("intermediate_size", 4 * h))
        params = layers * (4 * h * h + 3 * h * ffn) + 2 * vocab * h
        return cls(name=os.path.basename(os.path.dirname(os.path.abspath(path))) or path, params=float(params),
                   layers=layers, hidden=h, seq_len=int(cfg.get("max_position_embeddings", 2048)))


@dataclass(kw_only=True, slots=True)
class Calibration:
    """Per-op costs. ``sources`` says, for each field, whether it was measured here or assumed."""
    #: fraction of the accelerator's peak the model's matmuls reach
    mfu: float = 0.40
    #: compute slowdown while collectives share the device with the matmuls
    interference: float = 0.15
    #: achieved fraction of link bandwidth for bulk transfers
    link_efficiency: float = 0.80
    #: AdamW parameters per second per CPU core
    adam_params_per_s_per_core: float = 1.5e8
    #: gradient reduction (sum) bytes per second per CPU core
    reduce_bytes_per_s_per_core: float = 4e9
    sources: dict = field(default_factory=lambda: {
        "mfu": "assumed (typical large-model training on GPUs)",
        "interference": "assumed",
        "link_efficiency": "assumed",
        "adam_params_per_s_per_core": "assumed",
        "reduce_bytes_per_s_per_core": "assumed"})

    def __post_init__(self) -> None:
        for f in ("mfu", "link_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"{f}: must be in (0, 1], got {getattr(self, f)}")
        if self.interference < 0:
            raise ValueError(f"interference: must be >= 0, got {self.interference}")
        for f in ("adam_params_per_s_per_core", "reduce_bytes_per_s_per_core"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f}: must be > 0, got {getattr(self, f)}")


def _rate(fn, seconds: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 2:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def calibrate(seconds: float = 0.3) -> Calibration:
    """Measure the per-op costs this machine can show: AdamW and reduction per core, and interference.

    Interference is measured as the slowdown of a matmul loop while another
    thread runs collective-like work (sum of two buffers into a third, then a
    copy) on the same cores — what a collective costs the compute device when
    it is not offloaded. MFU and link efficiency cannot be measured without the
    target accelerator and network; they stay assumed.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n = 1 << 20
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n)
        opt = torch.optim.AdamW([p], lr=1e-3, foreach=False)
        adam = _rate(opt.step, seconds) * n
        a, b, c = torch.randn(4 * n), torch.randn(4 * n), torch.empty(4 * n)
        reduce_rate = _rate(lambda: torch.add(a, b, out=c), seconds) * 4 * n * 4 * 2
        x, y = torch.randn(384, 384), torch.randn(384, 384)
        alone = _rate(lambda: torch.mm(x, y), seconds)
        stop = threading.Event()

        def collective_like() -> None:
            while not stop.is_set():
                torch.add(a, b, out=c)
                a.copy_(c)
        t = threading.Thread(target=collective_like, daemon=True)
        t.start()
        try:
            shared = _rate(lambda: torch.mm(x, y), seconds)
        finally:
            stop.set()
            t.join(5)
    finally:
        torch.set_num_threads(threads)
    cores = os.cpu_count() or 1
    here = f"measured on this machine ({cores} cores, 1 thread per op)"
    cal = Calibration(adam_params_per_s_per_core=adam, reduce_bytes_per_s_per_core=reduce_rate,
                      interference=max(0.0, alone / shared - 1.0))
    cal.sources.update(adam_params_per_s_per_core=here, reduce_bytes_per_s_per_core=here,
                       interference=here + "; collective-like traffic on the compute cores")
    return cal


@dataclass(kw_only=True, slots=True)
class Cluster:
    gpus: int = 8
    gpu_tflops: float = 312.0
    #: per GPU (MSDP) and per worker (disaggregated), Gbit/s
    nic_gbps: float = 25.0
    gpus_per_node: int = 8
    servers: int = 2
    #: per parameter server (default: same NIC as a worker)
    server_nic_gbps: float | None = None
    #: aggregate SSD bandwidth of one training node / one server, GB/s
    node_ssd_gbs: float = 13.6
    server_ssd_gbs: float = 27.2
    node_cpu_cores: int = 64
    server_cpu_cores: int = 64
    micro_batch: int = 1
    recompute: bool = True
    #: the switch replicates parameters to the workers (else each server sends every worker its own copy)
    multicast: bool = True

    def __post_init__(self) -> None:
        for f in ("gpus", "gpus_per_node", "servers", "node_cpu_cores", "server_cpu_cores", "micro_batch"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: must be >= 1, got {getattr(self, f)}")
        for f in ("gpu_tflops", "nic_gbps", "node_ssd_gbs", "server_ssd_gbs"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f}: must be > 0, got {getattr(self, f)}")


def predict(model: ModelShape, cl: Cluster, cal: Calibration) -> dict:
    """Step time of both designs and where it goes ([Note: what each design pays per step])."""
    P, N, L = model.params, cl.gpus, model.layers
    tokens = cl.micro_batch * model.seq_len
    flops = (8 if cl.recompute else 6) * P * tokens
    t_comp = flops / (cl.gpu_tflops * 1e12 * cal.mfu)
    nic = cl.nic_gbps / 8 * GB * cal.link_efficiency
    wire = 2 * P

    # -- MSDP
    t_coll = 3 * wire * (N - 1) / N / nic
    t_fb = max(t_comp * (1 + cal.interference), t_coll) + t_coll / L
    gpus_here = min(cl.gpus_per_node, N)
    ssd_per_gpu = cl.node_ssd_gbs * GB / gpus_here
    cores_per_gpu = cl.node_cpu_cores / gpus_here
    shard = P / N
    t_opt_io = shard * 26 / ssd_per_gpu
    t_opt_cpu = shard / (cal.adam_params_per_s_per_core * cores_per_gpu)
    t_opt = max(t_opt_io, t_opt_cpu)
    msdp = {"step_s": t_fb + t_opt, "compute_s": t_comp, "compute_with_interference_s": t_comp * (1 + cal.interference),
            "collectives_s": t_coll, "exposed_collectives_s": t_fb - t_comp, "optimizer_s": t_opt,
            "optimizer_ssd_s": t_opt_io, "optimizer_cpu_s": t_opt_cpu}

    # -- disaggregated
    t_nic = 2 * wire / nic                      # 4P bytes in: two parameter fetches
    srv_nic = (cl.server_nic_gbps or cl.nic_gbps) / 8 * GB * cal.link_efficiency
    S = cl.servers
    ingress = wire / S
    egress = 2 * wire / S * (1 if cl.multicast else N)
    t_srv_net = max(ingress, egress) / srv_nic
    t_srv_io = P / S * 24 / (cl.server_ssd_gbs * GB)
    t_srv_cpu = P / S / (cal.adam_params_per_s_per_core * cl.server_cpu_cores)
    t_agg = N * wire / (cal.reduce_bytes_per_s_per_core * cl.server_cpu_cores)   # aggregator sums N buckets
    t_server = max(t_srv_net, t_srv_io, t_srv_cpu)
    bottleneck = max(t_comp, t_nic, t_server, t_agg)
    fill = wire / L / nic
    drain = t_server / L
    disagg = {"step_s": bottleneck + fill + drain, "compute_s": t_comp, "worker_nic_s": t_nic,
              "server_network_s": t_srv_net, "server_ssd_s": t_srv_io, "server_adam_s": t_srv_cpu,
              "aggregator_s": t_agg, "pipeline_fill_drain_s": fill + drain,
              "bottleneck": {t_comp: "worker compute", t_nic: "worker NIC", t_server: "parameter servers",
                             t_agg: "aggregator"}[bottleneck]}
    return {"prediction": True, "model": asdict(model), "cluster": asdict(cl), "msdp": msdp,
            "disaggregated": disagg, "speedup": msdp["step_s"] / disagg["step_s"],
            "calibration": {k: v for k, v in asdict(cal).items() if k != "sources"},
            "assumptions": assumptions(cl, cal)}


def assumptions(cl: Cluster, cal: Calibration) -> list[str]:
    out = [
        "PREDICTION from a step-time model, not a measurement on the described cluster",
        f"training FLOPs per token = {'8' if cl.recompute else '6'} x parameters "
        f"({'with' if cl.recompute else 'without'} activation recomputation), one micro-batch per GPU per step",
        "parameters and gradients travel in bf16 (2 B/param); fp32 master weights and AdamW moments rest on SSD "
        "(24 B/param read+written per step; MSDP also writes the 2 B bf16 copy)",
        "MSDP = ZeRO-3 with the optimizer offloaded to each node's NVMe (ZeRO-Infinity style): ring all-gather "
        "(forward), all-gather (backward), reduce-scatter; optimizer step after the backward, not overlapped",
        "MSDP collectives overlap compute layer by layer but slow it by the interference factor; the first "
        "layer's gather is exposed",
        "disaggregated: workers fetch parameters twice per step (forward and backward) and push gradients once; "
        "the aggregator reduces before the servers; servers update bucket by bucket during the backward",
        "the switch replicates parameters to all workers (multicast)" if cl.multicast
        else "the switch does not replicate: each server sends every worker its own copy",
        f"{cl.servers} parameter servers, each with {cl.server_cpu_cores} cores, {cl.server_ssd_gbs:g} GB/s of SSD "
        f"and a {cl.server_nic_gbps or cl.nic_gbps:g} Gbit/s NIC; training nodes have {cl.gpus_per_node} GPUs, "
        f"{cl.node_cpu_cores} cores and {cl.node_ssd_gbs:g} GB/s of SSD",
    ]
    for name, source in cal.sources.items():
        out.append(f"{name} = {getattr(cal, name):.4g}: {source}")
    return out


# ------------------------------------------------------------------------------------------ CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    d, c = Cluster(), Calibration()
    p.add_argument("--model", default="175b", help=f"{', '.join(MODELS)} or a Hugging Face config.json / directory")
    p.add_argument("--gpus", type=int, default=d.gpus)
    p.add_argument("--gpu-tflops", type=float, default=d.gpu_tflops, help="peak dense bf16 TFLOP/s per GPU")
    p.add_argument("--nic-gbps", type=float, default=d.nic_gbps, help="network bandwidth per GPU, Gbit/s")
    p.add_argument("--servers", type=int, default=d.servers, help="parameter servers (disaggregated design)")
    p.add_argument("--server-nic-gbps", type=float, help="NIC of a parameter server (default: --nic-gbps)")
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    p.add_argument("--node-ssd-gbs", type=float, default=d.node_ssd_gbs, help="SSD bandwidth of a GPU node, GB/s")
    p.add_argument("--server-ssd-gbs", type=float, default=d.server_ssd_gbs, help="SSD bandwidth of a server, GB/s")
    p.add_argument("--micro-batch", type=int, default=d.micro_batch, help="sequences per GPU per step")
    p.add_argument("--no-multicast", action="store_true", help="servers send each worker its own copy")
    p.add_argument("--mfu", type=float, help=f"matmul efficiency (default {c.mfu}, assumed)")
    p.add_argument("--interference", type=float, help="override the measured compute slowdown under collectives")
    p.add_argument("--no-calibrate", action="store_true", help="use assumed per-op costs instead of measuring here")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    model = ModelShape.resolve(args.model)
    cluster = Cluster(gpus=args.gpus, gpu_tflops=args.gpu_tflops, nic_gbps=args.nic_gbps, servers=args.servers,
                      server_nic_gbps=args.server_nic_gbps, gpus_per_node=args.gpus_per_node,
                      node_ssd_gbs=args.node_ssd_gbs, server_ssd_gbs=args.server_ssd_gbs,
                      micro_batch=args.micro_batch, multicast=not args.no_multicast)
    cal = Calibration() if args.no_calibrate else calibrate()
    if args.mfu is not None:
        cal.mfu = args.mfu
        cal.sources["mfu"] = "given on the command line"
    if args.interference is not None:
        cal.interference = args.interference
        cal.sources["interference"] = "given on the command line"
    Calibration.__post_init__(cal)
    result = predict(model, cluster, cal)
    if args.json:
        print(dumps(result))
        return 0
    m, d = result["msdp"], result["disaggregated"]
    print(f"PREDICTION (step-time model): {model.name}, {cluster.gpus} GPUs x {cluster.gpu_tflops:g} TFLOP/s, "
          f"{cluster.nic_gbps:g} Gbit/s NICs, {cluster.servers} parameter servers")
    print(f"  standard MSDP   {m['step_s']:10.2f} s/step = fwd/bwd {m['step_s'] - m['optimizer_s']:.2f} s (compute "
          f"{m['compute_s']:.2f} s, collectives {m['collectives_s']:.2f} s, exposed {m['exposed_collectives_s']:.2f} s)"
          f" + optimizer {m['optimizer_s']:.2f} s (SSD {m['optimizer_ssd_s']:.2f} s, CPU {m['optimizer_cpu_s']:.2f} s)")
    print(f"  disaggregated   {d['step_s']:10.2f} s/step = bottleneck {d['bottleneck']} "
          f"(compute {d['compute_s']:.2f} s,"
          f" worker NIC {d['worker_nic_s']:.2f} s, servers net {d['server_network_s']:.2f} / SSD "
          f"{d['server_ssd_s']:.2f} / AdamW {d['server_adam_s']:.2f} s, aggregator {d['aggregator_s']:.2f} s) "
          f"+ fill/drain {d['pipeline_fill_drain_s']:.2f} s")
    print(f"  predicted speedup of the disaggregated design: {result['speedup']:.2f}x")
    print("  assumptions:")
    for line in result["assumptions"]:
        print(f"    - {line}")
    return 0
