"""The TPC (throughput per cost) model of out-of-core GNN training.

Predicts the epoch time of terastack.gnn's pipeline for a workload on a machine,
names the bottleneck, and ranks hardware configurations by epochs per dollar
of ownership (purchase + energy over a stated lifetime), from a price table
(``prices.toml`` ships with the package; ``--prices FILE`` replaces it).

[Note: the epoch-time model]
Per batch, with ``n`` rows gathered, a cache serving fraction ``h`` of them
(from the workload's out-of-sample hit-rate curve, see terastack.gnn.storage.hotness)
and ``b`` blocks (``BLOCK``, 4 KiB: the store's O_DIRECT block) read per missed row:

    ssd     = (1 - h) n b BLOCK / (SSD random-read rate at b x BLOCK a read)   (all SSDs; without that figure
              min(SSD bandwidth, SSD IOPS x BLOCK): terastack.plan.read_rates [Note: random reads at
              the gather's own request size])
    gather  = n x (CPU per row) + (1 - h) n x (CPU per missed row)
              + (1 - h) n b x (kernel CPU per block read)                    (measured costs)
    sample  = measured sampler time per batch
    compute = measured training step (this machine), or FLOPs / (rate x efficiency)
              (the benchmarks measure the SSD's rate while the steps run, and the step beside reads at the
              predicted epoch's rate: terastack.gnn.advise [Note: the step measured beside the epoch's own
              read rate])
    pcie    = (1 - h_device) n x row_bytes / PCIe bandwidth                (with a GPU)
    topology: with the topology on the SSD, the sampler reads ``t`` blocks per batch for the
              neighbour lists (and indptr entries) its list cache misses, one read per hop,
              waiting for each; the SSD stage carries those bytes too. Its CPU work grows by the
              kernel's: sample_cpu = measured sampler CPU + t x (kernel CPU per block). Its waits:
              the gather submits a batch's feature reads (thousands of blocks) in one request,
              which the storage engine keeps ``queue_depth`` blocks of in flight and queues the
              rest in order, so the sampler's hop reads wait behind it: over a batch they wait
              for about one gather read besides their own, i.e. wait = ssd (the batch's whole
              SSD term). With ``S`` sampler threads
              (terastack.gnn.sampling.pipeline [Note: several sampler threads]) one thread's waits
              overlap the others' work, and the sampler stage delivers a batch every
              sample = max(sample_cpu, (sample_cpu + wait) / S)
              (its CPU work does not divide: the threads share the interpreter and the cores,
              which the CPU sums below account for). In memory: wait = 0, sample = sample_cpu.

The pipeline overlaps stages that use different resources. Without a GPU,
sampling, gathering and training share the CPU. When training takes every
core (``train_threads`` 0 or all of them) the stages cannot run beside it (an
OpenMP team stalls while one of its threads is descheduled), so they add up
and only the SSD overlaps them: ``batch = max(sample + gather + compute, ssd)``.
When training leaves cores free (``terastack gnn train`` gives it one core
less than the machine has), sampling and gathering run on the free cores
while the step runs. Their interpreter-side work is serial, but the kernel's
work per block read (``io`` = blocks x ``io_cpu_seconds_per_block``) runs in
the storage engine's own threads (io_uring control threads, outside the
interpreter lock), on whichever core is idle, so it is bounded only by the CPU
work over all cores: ``batch = max(compute, sample_cpu + gather - io,
(t compute + sample_cpu + gather) / cores, sample, ssd)`` for ``t < cores``
training threads (``sample`` is the sampler stage's period with its waits,
above). At the 48M-node scale run (2 cores, one training thread) the kernel's
share was 0.37 s of a 0.31 s batch: counted on the one free core, as this model
did before, it predicted 25.6% over the measured epoch; spread over both, +2%.
With every core training, ``batch = max(sample_cpu + gather + compute, sample, ssd)``. (On the 2-core development machine, quiet, the
pipelined epoch took 10-15% longer than its training steps alone: the
interpreter lock and memory bandwidth are still shared; with other work on
the cores it took the sum, since then no core is free.) With a GPU the training
step runs on the device and overlaps the CPU stages:
``batch = max(sample_cpu + gather, sample, ssd, pcie, compute)``. The epoch is
``batches x batch`` plus a prologue (one batch's sample + gather + ssd before
the first step). The largest term is the bottleneck.

The model is checked against measured epochs at three cache sizes by
``terastack bench gnn`` (``prediction_error``). The sampler's wait term is
read off two runs with one sampler thread on a 2-core machine, topology and
features on the SSD, the sampler busy 98-99% of each epoch: 48M nodes (0.237 s
of sampling a batch; this term, with the epoch's own block counts, 0.203 s:
-15%) and 4M nodes (0.127 s; this term 0.142 s: +12%). Its own reads at the
full rate alone (the earlier term) gave 0.099 s and 0.083 s; its own reads at
half the rate while the gather reads (the two streams served alike) 0.162 s
and 0.132 s: neither fits both runs better.
"""
from __future__ import annotations

import itertools
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from terastack.constants import BLOCK
from terastack.plan.hardware import Hardware
from terastack.plan.read_rates import ReadRate, random_read_rate

GIB = 1 << 30
DEFAULT_PRICES = Path(__file__).with_name("prices.toml")


@dataclass(kw_only=True, slots=True)
class GnnWorkload:
    """What one epoch of sampled training asks of the machine (from pre-sampling and calibration)."""

    num_nodes: int
    row_bytes: int
    feature_bytes: int
    batches_per_epoch: int
    nodes_per_batch: float
    #: cache rows -> fraction of row accesses they serve (monotone, from 0 rows to all)
    curve_rows: np.ndarray
    curve_hits: np.ndarray
    #: 4 KiB blocks read per missed row (>= 1 for rows up to 4 KiB; more when rows straddle blocks)
    blocks_per_miss: float
    sample_seconds: float
    #: measured training step on this machine's CPU (None: derive from FLOPs)
    compute_seconds: float | None = None
    #: training FLOPs per batch (forward + backward), for machines other than this one
    flops_per_batch: float = 0.0
    #: intra-op threads the measured training step used (0: every core)
    compute_threads: int = 0
    #: CPU seconds per gathered row (lookup, tier split, cache copy), measured on this machine
    gather_seconds_per_row: float = 2e-7
    #: extra CPU seconds per missed row (block planning, cutting the row out of the block buffer)
    miss_cpu_seconds_per_row: float = 2e-7
    #: kernel CPU seconds per 4 KiB block read (submission, completion, O_DIRECT page pinning), measured
    io_cpu_seconds_per_block: float = 0.0
    #: the cache's lookup table is paid from the host budget (bytes per node)
    table_bytes_per_node: int = 4
    #: 4 KiB blocks the sampler reads per batch for neighbour lists and indptr entries its list cache misses
    #: (topology on the SSD; 0 in memory); ``sample_seconds`` is then the sampler's CPU time without the reads
    topology_blocks_per_batch: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_nodes", "row_bytes", "batches_per_epoch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        self.curve_rows = np.asarray(self.curve_rows, dtype=np.float64)
        self.curve_hits = np.asarray(self.curve_hits, dtype=np.float64)
        if self.curve_rows.shape != self.curve_hits.shape or self.curve_rows.size < 2:
            raise ValueError("curve_rows, curve_hits: need two equal-length arrays of at least 2 points")
        for name in ("gather_seconds_per_row", "miss_cpu_seconds_per_row", "io_cpu_seconds_per_block",
                     "topology_blocks_per_batch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")

    def hit_rate(self, rows: float) -> float:
        return float(np.interp(rows, self.curve_rows, self.curve_hits))

    def cache_rows(self, device_bytes: int, host_bytes: int) -> tuple[int, int]:
        """Rows the unified cache holds in each tier for these budgets (same rule as UnifiedCache)."""
        table = self.num_nodes * self.table_bytes_per_node if device_bytes + host_bytes > 0 else 0
        dev = min(self.num_nodes, device_bytes // self.row_bytes)
        host = min(self.num_nodes - dev, max(0, host_bytes - table) // self.row_bytes)
        return int(dev), int(host)


@dataclass(kw_only=True, slots=True)
class Prediction:
    epoch_seconds: float
    batch_seconds: float
    bottleneck: str
    stages: dict
    hit_rate: float
    device_hit_rate: float
    ssd_bytes_per_epoch: float
    device_cache_bytes: int
    host_cache_bytes: int
    #: the SSD rate the feature reads were priced at, and its source
    ssd_rate: ReadRate | None = None
    label: str = "prediction"

    @property
    def ssd_rate_source(self) -> str:
        return self.ssd_rate.source if self.ssd_rate is not None else ""

    def to_dict(self) -> dict:
        return {"epoch_seconds": self.epoch_seconds, "batch_seconds": self.batch_seconds,
                "bottleneck": self.bottleneck, "stages_seconds_per_batch": self.stages, "hit_rate": self.hit_rate,
                "device_hit_rate": self.device_hit_rate, "ssd_bytes_per_epoch": self.ssd_bytes_per_epoch,
                "device_cache_bytes": self.device_cache_bytes, "host_cache_bytes": self.host_cache_bytes,
                "ssd_read_rate": self.ssd_rate.to_dict() if self.ssd_rate is not None else None,
                "label": self.label}


def predict_epoch(workload: GnnWorkload, hw: Hardware, *, device_cache: int, host_cache: int,
                  gpu_efficiency: float = 0.10, cpu_flops_reference: float | None = None,
                  train_threads: int = 0, samplers: int = 1, queue_depth: int | None = None) -> Prediction:
    """Epoch time of the pipeline on ``hw``; see [Note: the epoch-time model].

    Without a GPU the training step is ``workload.compute_seconds`` (measured
    on the machine whose CPU rate is ``cpu_flops_reference``), scaled by CPU
    FLOP rate when ``hw`` is another machine; ``train_threads`` is how many of
    ``hw``'s cores the step runs on (0: all of them); ``samplers`` the pipeline's sampler threads;
    ``queue_depth`` the storage engine's depth the gather reads at (None: any the hardware's figures were
    measured at). The SSD's rate is the one at the gather's request size where ``hw`` has it
    (terastack.plan.read_rates [Note: random reads at the gather's own request size]); the prediction names it.
    """
    if train_threads < 0:
        raise ValueError(f"train_threads: must be >= 0 (0: every core), got {train_threads}")
    if samplers < 1:
        raise ValueError(f"samplers: must be >= 1, got {samplers}")
    w = workload
    dev_rows, host_rows = w.cache_rows(device_cache, host_cache)
    hit = w.hit_rate(dev_rows + host_rows)
    dev_hit = w.hit_rate(dev_rows)
    n = w.nodes_per_batch
    miss_blocks = (1 - hit) * n * w.blocks_per_miss
    miss_bytes = miss_blocks * BLOCK
    # each missed row is one extent of its covering blocks; the sampler's list reads are single blocks
    # (a mean under one block: misses sharing blocks, each still read as a whole block)
    rows_rate = random_read_rate(hw, max(1.0, w.blocks_per_miss) * BLOCK, queue_depth=queue_depth)
    topology_bytes = w.topology_blocks_per_batch * BLOCK
    lists_rate = random_read_rate(hw, BLOCK, queue_depth=queue_depth) if topology_bytes > 0 else rows_rate
    ssd = miss_bytes / rows_rate.bytes_per_s + topology_bytes / lists_rate.bytes_per_s
    # CPU side of gathering: cache copies, cutting missed rows out of blocks, and the kernel's work per block read
    gather = (n * w.gather_seconds_per_row + (1 - hit) * n * w.miss_cpu_seconds_per_row
              + miss_blocks * w.io_cpu_seconds_per_block)
    # the sampler's CPU work (with the kernel's per block read), and its waits for its hop reads, which queue with
    # the gather's feature reads: several sampler threads overlap their waits (see the Note)
    sample_cpu = w.sample_seconds + w.topology_blocks_per_batch * w.io_cpu_seconds_per_block
    wait = ssd if topology_bytes > 0 else 0.0
    sample = max(sample_cpu, (sample_cpu + wait) / samplers)
    if hw.has_gpu:
        if w.flops_per_batch <= 0:
            raise ValueError("workload.flops_per_batch: needed to predict training on an accelerator")
        compute = w.flops_per_batch / (hw.gpu_flops * gpu_efficiency)
        pcie = (1 - dev_hit) * n * w.row_bytes / hw.pcie_bytes_per_s if hw.pcie_bytes_per_s > 0 else 0.0
        stages = {"sample+gather": max(sample_cpu + gather, sample), "ssd": ssd, "pcie": pcie, "compute": compute}
        bottleneck = max(stages, key=stages.get)
        batch = stages[bottleneck]
    else:
        if w.compute_seconds is not None:
            compute = w.compute_seconds
            if cpu_flops_reference and hw.cpu_flops > 0:
                compute *= cpu_flops_reference / hw.cpu_flops
        elif w.flops_per_batch > 0 and hw.cpu_flops > 0:
            compute = w.flops_per_batch / (hw.cpu_flops * 0.25)
        else:
            raise ValueError("workload.compute_seconds or flops_per_batch: needed to predict CPU training")
        # "sample": the sampler stage's period (its CPU work, or its waits shared among its threads)
        stages = {"sample": sample, "gather": gather, "compute": compute, "ssd": ssd}
        cores = max(1, hw.cores)
        threads = min(train_threads or cores, cores)
        if threads < cores:  # free cores: sampling and gathering run beside the step (see the Note)
            io = (w.topology_blocks_per_batch + miss_blocks) * w.io_cpu_seconds_per_block
            cpu = max(compute, sample_cpu + gather - io, (threads * compute + sample_cpu + gather) / cores)
        else:
            cpu = sample_cpu + gather + compute
        batch = max(cpu, sample, ssd)
        if ssd >= max(cpu, sample):
            bottleneck = "ssd"
        elif sample > cpu:
            bottleneck = "sample"  # the sampler's waits for its hop reads
        else:
            work = {"sample": sample_cpu, "gather": gather, "compute": compute}
            bottleneck = max(work, key=work.get)
    # + prologue: the first batch (sampled, its reads, gathered) before any step
    epoch = w.batches_per_epoch * batch + sample_cpu + gather + ssd
    return Prediction(epoch_seconds=epoch, batch_seconds=batch, bottleneck=bottleneck, stages=stages, hit_rate=hit,
                      device_hit_rate=dev_hit, ssd_bytes_per_epoch=(miss_bytes + topology_bytes) * w.batches_per_epoch,
                      device_cache_bytes=dev_rows * w.row_bytes, host_cache_bytes=host_rows * w.row_bytes,
                      ssd_rate=rows_rate)


# ----------------------------------------------------------------- prices
@dataclass(kw_only=True, slots=True)
class PriceTable:
    lifetime_years: float
    electricity_usd_per_kwh: float
    gpu_efficiency: float
    host_reserve_gib: float
    gpu_reserve_fraction: float
    base: dict
    memory: dict
    ssd: dict
    gpus: list[dict] = field(default_factory=list)
    source: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "PriceTable":
        path = Path(path) if path else DEFAULT_PRICES
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"prices: {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"prices: {path} is not valid TOML ({exc})") from None

        def num(obj: dict, key: str, where: str, minimum: float = 0.0) -> float:
            if key not in obj:
                raise ValueError(f"prices: {path}: field {where}{key} is missing")
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
                raise ValueError(f"prices: {path}: field {where}{key} must be a number >= {minimum}, got {value!r}")
            return float(value)

        for section in ("base", "memory", "ssd"):
            if not isinstance(data.get(section), dict):
                raise ValueError(f"prices: {path}: section [{section}] is missing")
        base = {"name": str(data["base"].get("name", "base")), "usd": num(data["base"], "usd", "base."),
                "watts": num(data["base"], "watts", "base."), "cpu_flops": num(data["base"], "cpu_flops", "base.")}
        options = data["memory"].get("options_gib", [])
        if not options or not all(isinstance(o, (int, float)) and o > 0 for o in options):
            raise ValueError(f"prices: {path}: field memory.options_gib must be a list of positive sizes")
        memory = {"usd_per_gib": num(data["memory"], "usd_per_gib", "memory."),
                  "watts_per_gib": num(data["memory"], "watts_per_gib", "memory."), "options_gib": list(options)}
        ssd = {"name": str(data["ssd"].get("name", "ssd")), "usd_each": num(data["ssd"], "usd_each", "ssd."),
               "watts_each": num(data["ssd"], "watts_each", "ssd."),
               "read_bytes_per_s": num(data["ssd"], "read_bytes_per_s", "ssd."),
               "rand4k_iops": num(data["ssd"], "rand4k_iops", "ssd.")}
        gpus = []
        for i, g in enumerate(data.get("gpu", [])):
            where = f"gpu[{i}]."
            if not isinstance(g, dict) or not isinstance(g.get("name"), str):
                raise ValueError(f"prices: {path}: field {where}name is missing")
            gpus.append({"name": g["name"], **{k: num(g, k, where) for k in
                                                ("usd", "watts", "flops", "memory_gib", "pcie_bytes_per_s")}})
        if not gpus:
            gpus = [{"name": "none", "usd": 0.0, "watts": 0.0, "flops": 0.0, "memory_gib": 0.0,
                     "pcie_bytes_per_s": 0.0}]
        return cls(lifetime_years=num(data, "lifetime_years", "", 0.01),
                   electricity_usd_per_kwh=num(data, "electricity_usd_per_kwh", ""),
                   gpu_efficiency=num(data, "gpu_efficiency", "", 1e-6),
                   host_reserve_gib=num(data, "host_reserve_gib", ""),
                   gpu_reserve_fraction=num(data, "gpu_reserve_fraction", ""),
                   base=base, memory=memory, ssd=ssd, gpus=gpus, source=str(path))

    def gpu(self, name: str) -> dict:
        for g in self.gpus:
            if g["name"].lower() == name.lower() or g["name"].lower().startswith(name.lower()):
                return g
        raise ValueError(f"gpus: {name!r} is not in the price table ({', '.join(g['name'] for g in self.gpus)})")


@dataclass(kw_only=True, slots=True)
class Candidate:
    gpu: str
    ssds: int
    memory_gib: float
    cost_usd: float
    capex_usd: float
    energy_usd: float
    watts: float
    prediction: Prediction
    #: epochs trained over the lifetime at full use, per dollar of ownership: the TPC figure
    epochs_per_usd: float

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "ssds": self.ssds, "memory_gib": self.memory_gib, "cost_usd": self.cost_usd,
                "capex_usd": self.capex_usd, "energy_usd": self.energy_usd, "watts": self.watts,
                "epoch_seconds": self.prediction.epoch_seconds, "bottleneck": self.prediction.bottleneck,
                "hit_rate": self.prediction.hit_rate, "epochs_per_usd": self.epochs_per_usd,
                "stages_seconds_per_batch": self.prediction.stages,
                "ssd_rate_source": self.prediction.ssd_rate_source,
                "epochs_per_hour": 3600.0 / self.prediction.epoch_seconds}


def advise(workload: GnnWorkload, probe: Hardware, prices: PriceTable, *, ssd_counts=(1, 2, 4),
           memory_gib=None, gpus=None) -> dict:
    """Rank hardware configurations by epochs per dollar of ownership (predictions).

    The SSD per-device figures come from the price table (0 there: this
    machine's probe); CPU training time is this machine's measured step scaled
    by CPU FLOP rate; accelerators are modelled from the table's FLOP rate.
    Sampling and gathering keep this machine's measured per-batch cost on
    every candidate: each runs on one thread of the pipeline, so more cores
    or an accelerator do not shorten them (they often become the bottleneck).
    """
    if any(int(s) < 1 for s in ssd_counts):
        raise ValueError(f"ssds: every SSD count must be >= 1, got {list(ssd_counts)}")
    memory_gib = list(memory_gib or prices.memory["options_gib"])
    gpu_rows = [prices.gpu(g) for g in gpus] if gpus else prices.gpus
    hours = prices.lifetime_years * 365.25 * 24
    ssd_bw = prices.ssd["read_bytes_per_s"] or probe.ssd_read_bytes_per_s
    ssd_iops = prices.ssd["rand4k_iops"] or probe.ssd_rand4k_iops
    # the probe's figures per request size go with its IOPS (a priced SSD has spec-sheet figures only)
    random_reads = [] if prices.ssd["rand4k_iops"] else list(probe.ssd_random_reads)
    candidates = []
    for gpu, ssds, mem in itertools.product(gpu_rows, ssd_counts, memory_gib):
        hw = Hardware(name=f"{prices.base['name']} + {gpu['name']} + {ssds} SSD + {mem:g} GiB", cores=probe.cores,
                      host_memory_bytes=int(mem * GIB), cpu_flops=prices.base["cpu_flops"],
                      memcpy_bytes_per_s=probe.memcpy_bytes_per_s, ssd_read_bytes_per_s=ssd_bw,
                      ssd_rand4k_iops=ssd_iops, ssd_random_reads=random_reads, ssds=int(ssds), gpu_name=None if gpu["flops"] == 0 else gpu["name"],
                      gpu_memory_bytes=int(gpu["memory_gib"] * GIB), gpu_flops=gpu["flops"],
                      pcie_bytes_per_s=gpu["pcie_bytes_per_s"])
        host_cache = int(max(0.0, mem - prices.host_reserve_gib) * GIB)
        device_cache = int(gpu["memory_gib"] * (1 - prices.gpu_reserve_fraction) * GIB)
        host_cache = min(host_cache, workload.feature_bytes + workload.num_nodes * workload.table_bytes_per_node)
        # the measured step used `compute_threads` of this machine's cores; a candidate trains on all of its own
        share = min(1.0, (workload.compute_threads or probe.cores) / probe.cores)
        pred = predict_epoch(workload, hw, device_cache=device_cache, host_cache=host_cache,
                             gpu_efficiency=prices.gpu_efficiency, cpu_flops_reference=probe.cpu_flops * share)
        watts = prices.base["watts"] + gpu["watts"] + ssds * prices.ssd["watts_each"] + mem * prices.memory["watts_per_gib"]
        capex = prices.base["usd"] + gpu["usd"] + ssds * prices.ssd["usd_each"] + mem * prices.memory["usd_per_gib"]
        energy = watts / 1000 * hours * prices.electricity_usd_per_kwh
        candidates.append(Candidate(gpu=gpu["name"], ssds=int(ssds), memory_gib=float(mem), cost_usd=capex + energy,
                                    capex_usd=capex, energy_usd=energy, watts=watts, prediction=pred,
                                    epochs_per_usd=hours * 3600.0 / pred.epoch_seconds / (capex + energy)))
    candidates.sort(key=lambda c: -c.epochs_per_usd)
    best = candidates[0]
    return {"label": "prediction (TPC model; prices from " + prices.source + ")",
            "tpc_unit": f"epochs per USD of ownership over {prices.lifetime_years:g} years",
            "best": best.to_dict(), "candidates": [c.to_dict() for c in candidates]}


def blocks_per_miss(row_bytes: int) -> float:
    """Mean 4 KiB blocks covering one row, over the row positions in a file (rows packed back to back)."""
    period = BLOCK // math.gcd(row_bytes, BLOCK)
    starts = np.arange(period, dtype=np.int64) * row_bytes
    spans = (starts + row_bytes - 1) // BLOCK - starts // BLOCK + 1
    return float(spans.mean())
