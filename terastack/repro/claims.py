"""Every claim the reproduction report checks: what the paper (or terastack itself) says, and which result field tests it.

This table is data: to check a new figure, add a row. A row names the
benchmark whose JSON result holds the measurement (a dotted path into it, a
ratio of two paths, or an aggregate over a list), the comparison and the
target, where a reader finds the claim, and why this machine may differ.

Where a claim comes from (every row says, so that a reader can look it up):
- ``source="paper"``: a published figure. ``paper`` names one of :data:`PAPERS` (title, venue, DOI or
  address) and ``where`` the place in it the figure is stated; ``paper_figure`` quotes it. Where a paper
  gives a figure only as a plot, no value is transcribed.
- ``source="project"``: a target terastack set itself; ``paper_figure`` states the target and ``rationale``
  the reason it was set (what a user would notice if it were missed). Such rows show as "terastack's
  target" in the report.

Scale claims need sizes a smoke run cannot afford (a model several times what memory holds, a graph
larger than RAM): ``measured_at`` names the presets that judge them, and ``not_measured_because`` says
why the others do not. Their benchmarks still run at every preset, so a smoke run shows they work.
"""
from __future__ import annotations

from dataclasses import dataclass

#: verdicts, in the order the summary counts them
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
REPORTED = "reported"
NOT_MEASURED = "not measured"
OUT_OF_SCOPE = "needs other hardware"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, REPORTED, NOT_MEASURED, OUT_OF_SCOPE)
PRESETS = ("smoke", "small", "full")

GPU_NVME = "a GPU server with NVMe SSDs (the paper's testbed)"
HERE_2CORE = ("this machine has 2 CPU cores and one virtual disk; compute is the CPU, "
              "so ratios that depend on a GPU's speed relative to the SSD differ")


@dataclass(frozen=True, kw_only=True, slots=True)
class Paper:
    #: how a claims table cell names it
    short: str
    #: the full reference: authors, title, venue, DOI or address
    reference: str


#: the published works terastack reproduces (DESIGN.md's table), as a reader finds them
PAPERS = {
    "CAM": Paper(short="CAM (Song et al., ICDE 2025)",
                 reference="Ziyu Song, Jie Zhang, Jie Sun, Mo Sun, Zihan Yang, Zheng Zhang, Xuzheng Chen, Fei Wu, "
                           "Huajin Tang, Zeke Wang. CAM: Asynchronous GPU-Initiated, CPU-Managed SSD Management for "
                           "Batching Storage Access. IEEE ICDE 2025, pp. 2309-2322. doi:10.1109/ICDE65448.2025.00175"),
    "Ratel": Paper(short="Ratel (Liao et al., ICDE 2025)",
                   reference="Changyue Liao, Mo Sun, Zihan Yang, Jun Xie, Kaiqi Chen, Binhang Yuan, Fei Wu, Zeke "
                             "Wang. Ratel: Optimizing Holistic Data Movement to Fine-tune 100B Model on a Consumer "
                             "GPU. IEEE ICDE 2025, pp. 292-306. doi:10.1109/ICDE65448.2025.00029 (its preprint is "
                             "titled LoHan)"),
    "Hyperion": Paper(short="Hyperion (ICDE 2025)",
                      reference="Hyperion: an out-of-core GNN training system with a GPU-initiated asynchronous disk "
                                "I/O stack. IEEE ICDE 2025; paper and code listed at https://github.com/RC4ML/Hyperion"),
    "DisDP": Paper(short="DisDP (LuWu preprint, arXiv:2409.00918)",
                   reference="LuWu: An End-to-End In-Network Out-of-Core Optimizer for 100B-Scale Model-in-Network "
                             "Data-Parallel Training on Distributed GPUs. arXiv:2409.00918 (2024): the disaggregated, "
                             "model-sharded data parallelism terastack.disdp implements"),
    "DaCe": Paper(short="DaCe (Ziogas et al., SC'21)",
                  reference="Alexandros Nikolaos Ziogas, Timo Schneider, Tal Ben-Nun, Alexandru Calotoiu, Tiziano De "
                            "Matteis, Johannes de Fine Licht, Luca Lavarini, Torsten Hoefler. Productivity, "
                            "Portability, Performance: Data-Centric Python. SC '21. doi:10.1145/3458817.3476176"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    id: str
    #: harness suite that measures it (io, kernels, llm, gnn, dist, scale, dace)
    suite: str
    #: benchmark inside the suite whose result holds the field (a bench name, or "dace")
    benchmark: str
    title: str
    #: "paper" (a published figure: ``paper`` and ``where`` say which) or "project" (terastack's own target:
    #: ``rationale`` says why it was set)
    source: str
    #: the paper's words or terastack's target, quoted
    paper_figure: str
    #: with source "paper": a key of PAPERS
    paper: str = ""
    #: with source "paper": where in the paper the figure is stated
    where: str = ""
    #: with source "project": why terastack set this target
    rationale: str = ""
    paper_value: float | None = None
    paper_hardware: str = ""
    #: dotted path into the result (None: this machine cannot measure it, see ``differs_because``)
    field: str | None = None
    #: the value is field * factor (then / ratio_to when set); factor turns a count into bytes, say
    factor: float = 1.0
    #: the value is field / ratio_to when set
    ratio_to: str | None = None
    #: how a list-valued field is reduced: "max", "min" or "mean"
    aggregate: str | None = None
    baseline: str = ""
    #: comparison against ``target``: ">=", "<=" or "=="; target None: reported, no verdict
    comparison: str = ">="
    target: float | None = None
    unit: str = "x"
    #: why a figure on this machine may differ from the paper's (shown when it does)
    differs_because: str = ""
    #: the command that answers it as a labelled model prediction, when the hardware is absent here
    prediction_command: str | None = None
    #: the presets whose runs judge it (the benchmark runs at every preset regardless)
    measured_at: tuple[str, ...] = PRESETS
    #: why the other presets do not judge it
    not_measured_because: str = ""

    def __post_init__(self) -> None:
        if self.comparison not in (">=", "<=", "=="):
            raise ValueError(f"claim {self.id}: comparison: must be '>=', '<=' or '==', got {self.comparison!r}")
        if self.aggregate not in (None, "max", "min", "mean"):
            raise ValueError(f"claim {self.id}: aggregate: must be max, min, mean or None")
        if self.source == "paper":
            if self.paper not in PAPERS:
                raise ValueError(f"claim {self.id}: paper: must be one of {', '.join(PAPERS)}, got {self.paper!r}")
            if not self.where:
                raise ValueError(f"claim {self.id}: where: say where in {self.paper} the figure is stated")
        elif self.source == "project":
            if not self.rationale:
                raise ValueError(f"claim {self.id}: rationale: say why terastack set this target")
        else:
            raise ValueError(f"claim {self.id}: source: must be 'paper' or 'project'")
        if self.field is None and not self.differs_because:
            raise ValueError(f"claim {self.id}: differs_because: a claim not measured here must say why")
        unknown = [p for p in self.measured_at if p not in PRESETS]
        if unknown or not self.measured_at:
            raise ValueError(f"claim {self.id}: measured_at: presets from {PRESETS}, got {self.measured_at!r}")
        if set(self.measured_at) != set(PRESETS) and not self.not_measured_because:
            raise ValueError(f"claim {self.id}: not_measured_because: say why presets other than "
                             f"{', '.join(self.measured_at)} do not judge it")

    def source_text(self) -> str:
        """Where the claim comes from, as the report's table shows it."""
        if self.source == "paper":
            return f"{PAPERS[self.paper].short}, {self.where}: {self.paper_figure}"
        return f"terastack's target: {self.paper_figure} ({self.rationale})"


#: why the storage engine's targets are ratios to fio: fio is the tool people measure their drives with
_FIO = "fio is how users measure their drives; "
#: the DaCe rows terastack adds to the paper's aggregate figures
_NPBENCH = "the per-kernel view behind the paper's aggregate speedups, NPBench's way of reporting them"

#: llm-scale's ladder and what each preset can show
_LADDER_SMALL = ("preset small stops the ladder at 1.1B parameters with an 8 GiB limit to finish in tens of "
                 "minutes; the full ladder reaches 3.4B")
_SMOKE_SCALE = ("preset smoke runs the benchmark at a tiny size to show it works end to end; a model or graph "
                "that small fits in memory, so there is no scale to judge")

CLAIMS: tuple[Claim, ...] = (
    # ------------------------------------------------------------------ io (CAM storage engine)
    Claim(id="io.seq_read", suite="io", benchmark="io", title="1 MiB sequential read at the device's speed",
          source="project", paper_figure=">= 0.90 of fio on the same file",
          rationale=_FIO + "within 10% of it, the storage engine adds no cost a user would notice",
          field="seq_read_vs_fio", baseline="fio, same file, same queue depth", target=0.90,
          differs_because="a virtual disk's rate varies from run to run (the log gives every pair)"),
    Claim(id="io.seq_write", suite="io", benchmark="io", title="1 MiB sequential write at the device's speed",
          source="project", paper_figure=">= 0.90 of fio on the same file",
          rationale=_FIO + "within 10% of it, checkpoints and stores write as fast as the drive allows",
          field="seq_write_vs_fio", baseline="fio, same file", target=0.90,
          differs_because="a virtual disk's write rate varies from run to run, fio's as much as "
                          "terastack's (the log gives every pair)"),
    Claim(id="io.seq_read_huge_pages", suite="io", benchmark="io",
          title="1 MiB sequential read from terastack's own (huge-page) buffers", source="project",
          paper_figure="transfers at the device's speed, reported",
          rationale="the engines read into terastack's aligned arena, not fio's buffers: this is the rate they get",
          field="seq_read_huge_pages_vs_fio", baseline="fio with its default (4 KiB-page) buffers, same file",
          target=None, differs_because="reported: what the allocator's huge pages add (fewer DMA segments and page pins)"),
    Claim(id="io.seq_write_huge_pages", suite="io", benchmark="io",
          title="1 MiB sequential write from terastack's own (huge-page) buffers", source="project",
          paper_figure="transfers at the device's speed, reported",
          rationale="the engines write from terastack's aligned arena, not fio's buffers: this is the rate they get",
          field="seq_write_huge_pages_vs_fio", baseline="fio with its default (4 KiB-page) buffers, same file",
          target=None, differs_because="reported: what the allocator's huge pages add (fewer DMA segments and page pins)"),
    Claim(id="io.rand4k", suite="io", benchmark="io", title="4 KiB random read, queue depth 64",
          source="project", paper_figure=">= 0.85 of fio on the same file",
          rationale=_FIO + "GNN feature gathers are 4 KiB random reads, so their rate bounds an out-of-core epoch; "
                    "the margin is wider than for 1 MiB reads because each request costs CPU on both sides",
          field="rand4k_read_vs_fio", baseline="fio, same file, QD 64", target=0.85,
          differs_because="a virtual disk's IOPS vary from run to run"),
    Claim(id="io.batch_submit", suite="io", benchmark="io", title="small-request submission rate (batch API)",
          source="project", paper_figure=">= 1,000,000 ops/s, page cache hot",
          rationale="one Python call per request tops out near 0.5M ops/s; an NVMe drive serves about 1M 4 KiB "
                    "reads/s, so submission must not be what limits a batch (DESIGN.md, the storage engine)",
          field="batch_submit_ops_per_s", baseline="none (absolute rate on 2 cores)", target=1e6, unit="ops/s",
          differs_because="2 cores bound the rate"),
    # ------------------------------------------------------------------ kernels (CAM proof workloads)
    Claim(id="cam.gemm", suite="kernels", benchmark="gemm", title="out-of-core GEMM, I/O overlapped",
          source="paper", paper="CAM", where="headline results",
          paper_figure="GEMM 1.84x faster than synchronous I/O", paper_value=1.84,
          paper_hardware=GPU_NVME, field="speedup_vs_sync", baseline="same tiling, synchronous read/compute/write",
          target=1.84,
          differs_because="overlap can at best turn compute + I/O into max(compute, I/O): the bound is "
                          "(c + i) / max(c, i) <= 2, reached only when both are equal; see hidden_fraction. "
                          + HERE_2CORE),
    Claim(id="cam.gemm_hidden", suite="kernels", benchmark="gemm", title="GEMM: fraction of the smaller side hidden",
          source="project", paper_figure="hidden_fraction >= 0.8",
          rationale="the speedup CAM reports depends on the machine's compute-to-I/O balance; the share of the "
                    "smaller side the overlap hides does not, so it is the form of the claim any machine can check",
          field="hidden_fraction", baseline="compute alone and I/O alone, same run", target=0.8, unit="fraction",
          differs_because="compute and I/O share the same 2 cores here"),
    Claim(id="cam.sort", suite="kernels", benchmark="sort", title="external merge sort, I/O overlapped",
          source="paper", paper="CAM", where="headline results",
          paper_figure="merge sort 1.5x faster than synchronous I/O", paper_value=1.5,
          paper_hardware=GPU_NVME, field="speedup_vs_sync", baseline="same sort, synchronous I/O", target=1.5,
          differs_because="on 2 cores sorting is compute-bound, so the I/O to hide is small and the speedup "
                          "bound (c + i) / max(c, i) is close to 1. " + HERE_2CORE),
    Claim(id="cam.sort_hidden", suite="kernels", benchmark="sort", title="sort: fraction of the smaller side hidden",
          source="project", paper_figure="hidden_fraction >= 0.8",
          rationale="as for GEMM: the hidden share is the machine-independent form of CAM's speedup",
          field="hidden_fraction", baseline="run formation + merge alone and I/O alone", target=0.8, unit="fraction",
          differs_because="compute and I/O share the same 2 cores here"),
    # ------------------------------------------------------------------ llm (Ratel)
    Claim(id="ratel.zero_infinity", suite="llm", benchmark="llm", title="fine-tuning throughput vs ZeRO-Infinity",
          source="paper", paper="Ratel", where="abstract",
          paper_figure="2.32x the throughput of the state-of-the-art baselines when fine-tuning a 13B model",
          paper_value=2.32,
          paper_hardware="one 24 GB consumer GPU (RTX 4090), 256 GB RAM, NVMe SSDs",
          field="speedup_vs_zero_infinity",
          baseline="DeepSpeed ZeRO-Infinity (ZeRO-3, params + optimizer on NVMe), same model and machine",
          target=1.8,
          differs_because="here a ~150M model on CPU (no GPU): the overlap of CPU Adam with GPU backward that "
                          "Ratel exploits becomes CPU-with-CPU; terastack's own target is 1.8x"),
    Claim(id="ratel.in_memory", suite="llm", benchmark="llm", title="slowdown vs plain in-memory training",
          source="project", paper_figure="<= 1.15 with a quarter of the training state in memory",
          rationale="offloading is worth turning on only if, where the hardware can hide the traffic, a user "
                    "pays little for it next to plain PyTorch",
          field="slowdown_vs_in_memory", comparison="<=",
          baseline="plain PyTorch AdamW with everything in memory", target=1.15,
          differs_because="most of the state lives on the SSD: each step reads and writes it (about 2.9 GB at the "
                          "default size) and runs AdamW over every parameter on the same 2 cores that run forward "
                          "and backward; io_contention_share in the result says how much of the gap the SSD "
                          "traffic's effect on compute explains"),
    Claim(id="ratel.engine_cost", suite="llm", benchmark="llm",
          title="the engine's own cost: host-resident step vs in-memory step",
          source="project", paper_figure="<= 1.05 with the whole training state in host memory",
          rationale="with nothing on the SSD the only difference from plain PyTorch is terastack's own machinery "
                    "(store, fetcher, hooks, per-layer optimizer); a user who turns offloading on should not pay "
                    "more than 5% for it where it is not needed",
          field="slowdown_vs_in_memory_host_resident", comparison="<=", target=1.05,
          baseline="plain PyTorch AdamW, its steps alternating with terastack's in the same process",
          differs_because="other work on the 2 cores moves single steps by more than the effect (per-pair ratios "
                          "0.85-1.16 on a busy day); host_resident_paired_ratio_median is the steadier figure",
          measured_at=("small", "full"),
          not_measured_because="preset smoke's tiny model takes milliseconds a step, so the fixed per-step cost is "
                               "all there is to time: the ratio says nothing about a real model"),
    Claim(id="ratel.engine_cost_paired", suite="llm", benchmark="llm",
          title="the engine's own cost: median of paired step ratios (host-resident)",
          source="project", paper_figure="<= 1.05, median of the ratios of steps run back to back on one batch",
          rationale="the same target as ratel.engine_cost, read from the pairs of steps so that a load spike "
                    "during one system's steps does not pass for the engine's cost",
          field="host_resident_paired_ratio_median", comparison="<=", target=1.05,
          baseline="plain PyTorch AdamW, the step run right after terastack's on the same batch",
          differs_because="the 2 cores are shared; see ratel.engine_cost",
          measured_at=("small", "full"),
          not_measured_because="preset smoke's tiny model takes milliseconds a step (see ratel.engine_cost)"),
    Claim(id="ratel.175b", suite="llm", benchmark="llm", title="175B fine-tuning on one 24 GB GPU + 256 GB RAM",
          source="paper", paper="Ratel", where="abstract",
          paper_figure="the first to fine-tune a 175B model on an RTX 4090 and 256 GB main memory",
          paper_hardware="one 24 GB consumer GPU, 256 GB RAM, NVMe SSDs",
          differs_because="needs a 24 GB GPU, 256 GB RAM and several TB of SSD; this machine has 2 cores, 24 GiB",
          prediction_command="terastack plan llm --model opt-175b --gpu-mem 24GB --host-mem 256GB"),
    # ------------------------------------------------------------------ scale (Ratel's and Hyperion's scale)
    Claim(id="ratel.scale_state_vs_memory", suite="scale", benchmark="llm-scale",
          title="training state of the largest model terastack fine-tunes, over its memory budget",
          source="paper", paper="Ratel", where="abstract (175B on an RTX 4090 with 256 GB main memory)",
          paper_figure="a 175B model's training state (16 bytes a parameter: 2.8 TB) in 24 GB + 256 GB of "
                       "memory: 10x what memory holds",
          paper_value=10.0, paper_hardware="one 24 GB consumer GPU, 256 GB RAM, NVMe SSDs",
          field="max_params_terastack", factor=16, ratio_to="memory_budget_bytes", target=10.0,
          baseline="the whole process's memory budget (4 GiB), peak RSS held under it by the watchdog",
          differs_because="the ladder's largest rung is 3.4B, so the ratio cannot pass 3.4e9 x 16 B / 4 GiB = "
                          "12.8x; a machine with a larger disk can add rungs (--sizes)",
          measured_at=("full",), not_measured_because=_SMOKE_SCALE + "; " + _LADDER_SMALL),
    Claim(id="ratel.scale_vs_in_memory", suite="scale", benchmark="llm-scale",
          title="largest model fully fine-tuned: terastack (4 GiB budget) / in-memory PyTorch (the RSS limit)",
          source="project", paper_figure=">= 2x the parameters in-memory PyTorch trains under the same limit",
          rationale="offloading earns its cost where it changes which model a user can fine-tune; terastack "
                    "does it inside a budget smaller than the limit in-memory training is given",
          field="max_params_terastack", ratio_to="max_params_in_memory", target=2.0,
          baseline="plain PyTorch AdamW in RAM, in its own process under the same RSS watchdog",
          differs_because="the ladder's rungs are 0.15B, 0.55B, 1.1B and 3.4B, so the ratio moves in steps",
          measured_at=("small", "full"), not_measured_because=_SMOKE_SCALE),
    Claim(id="ratel.scale_vs_zero_infinity", suite="scale", benchmark="llm-scale",
          title="largest model fully fine-tuned: terastack / ZeRO-Infinity (same RSS limit)",
          source="project", paper_figure=">= 2x the parameters ZeRO-Infinity trains under the same limit",
          rationale="Ratel's holistic planning is meant to fit models that ZeRO-Infinity's NVMe offload cannot "
                    "in the same memory; 2x is one rung of the ladder",
          field="max_params_terastack", ratio_to="max_params_zero_infinity", target=2.0,
          baseline="DeepSpeed ZeRO-3, parameters and optimizer state offloaded to NVMe, under the same watchdog",
          differs_because="ZeRO-Infinity's CPU buffers grow with the model on a machine without a GPU",
          measured_at=("small", "full"), not_measured_because=_SMOKE_SCALE),
    Claim(id="hyperion.larger_than_ram", suite="scale", benchmark="gnn-scale",
          title="GNN training on a graph larger than RAM (dataset bytes / MemTotal)",
          source="paper", paper="Hyperion", where="headline result (terabyte-scale graphs on one machine)",
          paper_figure="out-of-core GNN training on graphs far larger than host memory", paper_hardware=GPU_NVME,
          field="dataset_to_ram_ratio", target=1.0,
          baseline="this machine's MemTotal",
          differs_because="the full preset's graph (48M nodes, 28 GB) is sized for this 23.5 GiB machine; on a "
                          "larger machine give --nodes to the benchmark directly",
          measured_at=("full",),
          not_measured_because=_SMOKE_SCALE + "; preset small's graph (2.3 GB) is sized to generate in minutes"),
    Claim(id="hyperion.scale_rss", suite="scale", benchmark="gnn-scale",
          title="peak RSS of the out-of-core epoch within 4 GiB", source="project",
          paper_figure="peak RSS <= 4 GiB whatever the graph's size",
          rationale="memory use is set by the one cache budget (1 GiB at full), not by the graph: a graph larger "
                    "than RAM trains on a machine with a few GiB to spare",
          field="peak_rss_within_4GiB", comparison="==", target=1, unit="bool",
          baseline="VmHWM of the training process (no children while it trains)",
          differs_because="should not differ: it counts bytes, not time",
          measured_at=("small", "full"), not_measured_because=_SMOKE_SCALE),
    Claim(id="hyperion.scale_tpc", suite="scale", benchmark="gnn-scale",
          title="TPC model at scale: predicted vs measured epoch", source="project",
          paper_figure="within 10%, topology read from the SSD too",
          rationale="the advice is meant for graphs larger than memory: its model must hold there, where topology "
                    "reads join the feature reads (the model counts the neighbour-list blocks the cache misses)",
          field="tpc_prediction_error", comparison="<=", target=0.10, unit="fraction",
          baseline="the measured epoch, same run",
          measured_at=("small", "full"), not_measured_because=_SMOKE_SCALE),
    # ------------------------------------------------------------------ gnn (Hyperion; CAM's GNN figure)
    Claim(id="cam.gnn", suite="gnn", benchmark="gnn", title="GNN feature gathering vs synchronous I/O",
          source="paper", paper="CAM", where="headline results",
          paper_figure="GNN training 1.84x faster than synchronous I/O", paper_value=1.84,
          paper_hardware=GPU_NVME, field="speedup_vs_sync_gather",
          baseline="synchronous batched gathering through the same engine", target=1.84,
          differs_because="training a batch on 2 CPU cores is slow next to the SSD reads it overlaps. " + HERE_2CORE),
    Claim(id="hyperion.in_memory", suite="gnn", benchmark="gnn", title="out-of-core epoch vs in-memory epoch",
          source="paper", paper="Hyperion", where="headline result",
          paper_figure="in-memory-like training throughput with cheap NVMe SSDs; judged here as a slowdown "
                       "<= 1.15 with features 4x the cache budget", paper_hardware=GPU_NVME,
          field="slowdown_vs_in_memory_pipelined", comparison="<=", target=1.15,
          baseline="same model, features and topology in memory, fed through the same pipeline (same sampler, "
                   "threads, batch shapes, prefetch depth); the serial in-memory loop is "
                   "slowdown_vs_in_memory_serial", differs_because=HERE_2CORE),
    Claim(id="hyperion.mmap", suite="gnn", benchmark="gnn", title="out-of-core epoch vs np.memmap features",
          source="project", paper_figure=">= 3x", field="speedup_vs_mmap", target=3.0,
          rationale="np.memmap is what a user gets for free; an engine has to beat it clearly under the same "
                    "memory to be worth adopting",
          baseline="features in np.memmap under the same memory budget",
          differs_because="the page cache of a virtual disk behaves differently from a local NVMe drive"),
    Claim(id="hyperion.tpc_model", suite="gnn", benchmark="gnn", title="TPC model: predicted vs measured epoch time",
          source="project", paper_figure="within 20% at three cache sizes", field="prediction_error",
          rationale="`terastack gnn advise` picks hardware from these predictions; an error above 20% can pick "
                    "the wrong configuration",
          aggregate="max", comparison="<=", target=0.20, unit="fraction", baseline="measured epochs, same run",
          differs_because="the model leaves out what the pipeline's stages still share (the interpreter "
                          "lock, memory bandwidth) and any other work on the cores"),
    Claim(id="hyperion.accuracy", suite="gnn", benchmark="gnn", title="accuracy equal to in-memory training",
          source="project", paper_figure="within 1 point", field="accuracy_diff_points", comparison="<=",
          rationale="out-of-core training must not change what the model learns; features are bit-identical, so "
                    "any larger gap is a bug",
          target=1.0, unit="points", baseline="in-memory training, same seed",
          differs_because="should not differ: features are bit-identical"),
    Claim(id="hyperion.tpc", suite="gnn", benchmark="gnn", title="throughput per cost vs out-of-core baselines",
          source="paper", paper="Hyperion", where="headline result",
          paper_figure=">3.1x throughput per cost (TPC) vs out-of-core baselines", paper_value=3.1,
          paper_hardware=GPU_NVME,
          differs_because="TPC compares hardware configurations with prices; one machine here cannot measure it",
          prediction_command="terastack gnn advise --data DIR"),
    # ------------------------------------------------------------------ dist (DisDP)
    Claim(id="disdp.fsdp2", suite="dist", benchmark="dist", title="step time vs FSDP2 (2 CPU workers)",
          source="paper", paper="DisDP", where="abstract",
          paper_figure="3.98x vs the state-of-the-art training system on a 175B model with 8 workers",
          paper_value=3.98,
          paper_hardware="8 GPUs with SmartNIC/SmartSwitch offload, 175B model", field="speedup_vs_fsdp2",
          baseline="PyTorch FSDP2 (fully_shard) on a gloo CPU mesh, same model",
          differs_because="2 CPU workers on 2 cores with a small model: communication agents share the "
                          "cores they are meant to free; the paper's figure is at 175B/8 GPUs (see `dist simulate`)",
          prediction_command="terastack dist simulate --model opt-175b --gpus 8"),
    Claim(id="disdp.exposed_comm", suite="dist", benchmark="dist",
          title="exposed communication, terastack / FSDP2", source="project",
          paper_figure="at most half of FSDP2's",
          rationale="the communication agents exist to take collectives off the compute path; if they do not "
                    "halve what the step waits for, they are not worth their processes",
          field="exposed_comm_fraction.terastack",
          ratio_to="exposed_comm_fraction.fsdp2", comparison="<=", target=0.5, unit="ratio",
          baseline="FSDP2's exposed communication fraction, same run",
          differs_because="agents run on the same 2 cores as the workers"),
    Claim(id="disdp.equal", suite="dist", benchmark="dist", title="parameters equal single-process training",
          source="project", paper_figure="max abs diff <= 1e-5", field="correct_within_1e-5",
          rationale="a distributed job must train the same model as the single-process one (DESIGN.md: results "
                    "must equal the single-process job)",
          comparison="==", target=1, unit="bool", baseline="single-process AdamW, same data and seeds",
          differs_because="should not differ"),
    Claim(id="disdp.ingress_flat", suite="dist", benchmark="dist",
          title="server ingress per step flat in the number of workers (with the aggregator)", source="project",
          paper_figure="aggregation before the parameter server keeps its ingress flat in the number of workers",
          rationale="DisDP aggregates gradients in the network before its optimizer node, so that node's ingress "
                    "does not grow with the workers; terastack's aggregator stands in for that, and counting the "
                    "server's bytes shows whether it does",
          field="server_ingress_flat_with_aggregator",
          comparison="==", target=1, unit="bool", baseline="the same job without the aggregator (grows with workers)",
          differs_because="should not differ: it counts bytes, not time"),
    Claim(id="disdp.worker_state", suite="dist", benchmark="dist", title="optimizer bytes held by workers",
          source="project", paper_figure="0", field="worker_optimizer_bytes", comparison="==", target=0,
          rationale="the design moves every optimizer state to the parameter-server shards (as DisDP moves them "
                    "to its optimizer node); a byte left on a worker is memory the model cannot use",
          unit="bytes", baseline="—", differs_because="should not differ"),
    # ------------------------------------------------------------------ dace (Ziogas et al., SC'21)
    Claim(id="dace.cpu_vs_best", suite="dace", benchmark="dace",
          title="DaCe CPU speedup over the best of NumPy and Numba (geometric mean over kernels)",
          source="paper", paper="DaCe", where="abstract",
          paper_figure="2.47x speedup over previous-best solutions (CPU)", paper_value=2.47,
          paper_hardware="a multi-core CPU node (model given in the paper, not transcribed here)",
          field="speedups.vs_best_other_geomean", baseline="per kernel, the faster of NumPy and Numba",
          target=2.47,
          differs_because="2 cores instead of a many-core node (DaCe's parallel maps have little to gain); "
                          "12+ kernels written here, not NPBench's 52; previous-best in the paper includes "
                          "Pythran and others not run here; DaCe uses OpenBLAS here"),
    Claim(id="dace.cpu_vs_numpy", suite="dace", benchmark="dace", title="DaCe speedup over NumPy (geometric mean)",
          source="project", paper_figure="speedup over NumPy per kernel, reported", rationale=_NPBENCH,
          field="speedups.geomean.dace", baseline="NumPy, same inputs, same threads",
          differs_because="see the per-kernel table"),
    Claim(id="dace.numba_vs_numpy", suite="dace", benchmark="dace", title="Numba speedup over NumPy (geometric mean)",
          source="project", paper_figure="speedup over NumPy per kernel, reported", rationale=_NPBENCH,
          field="speedups.geomean.numba",
          baseline="NumPy, same inputs, same threads", differs_because="see the per-kernel table"),
    Claim(id="dace.validation", suite="dace", benchmark="dace", title="every framework's output equals NumPy's",
          source="project", paper_figure="allclose with stated tolerances; failures reported",
          rationale="a speedup counts only for a kernel that computes the right answer, as NPBench validates "
                    "every framework against NumPy before timing",
          field="validation_failures", comparison="==", target=0, unit="failures",
          baseline="NumPy output, same inputs", differs_because="a failure is a compiler bug or a kernel bug"),
    Claim(id="dace.weak_scaling", suite="dace", benchmark="dace",
          title="weak-scaling efficiency at the largest process count (worst of gemm, atax, jacobi_2d)",
          source="paper", paper="DaCe", where="abstract",
          paper_figure="up to 93.16% scaling efficiency on 512 nodes", paper_value=0.9316,
          paper_hardware="Piz Daint, up to 512 nodes (23,328 cores)", field="scaling_summary.weak_efficiency_min",
          baseline="the same kernel on 1 process", target=0.9316, unit="fraction",
          differs_because="P is at most the cores here (2), and the ranks share one memory system; the "
                          "rank-local kernels are DaCe-compiled but communication goes through mpi4py, where the "
                          "paper's distributed programs are DaCe-generated end to end"),
    Claim(id="dace.gpu", suite="dace", benchmark="dace", title="DaCe GPU speedup over previous-best",
          source="paper", paper="DaCe", where="abstract",
          paper_figure="3.75x speedup over previous-best solutions (GPU)", paper_value=3.75,
          paper_hardware="an NVIDIA GPU (model given in the paper)",
          differs_because="no GPU (and no CUDA toolkit) on this machine"),
)
