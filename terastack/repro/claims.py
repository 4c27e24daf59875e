"""Every claim the reproduction report checks: what the paper (or the project) says, and which result field tests it.

This table is data: to check a new figure, add a row. A row names the
benchmark whose JSON result holds the measurement (a dotted path into it, a
ratio of two paths, or an aggregate over a list), the comparison and the
target, and why this machine may differ. Paper figures are quoted from the
papers' abstracts or from the project's design document (which takes them
from the papers); where a paper gives only a plot, no value is transcribed.

Sources (design document table, DESIGN.md):
- CAM (storage I/O): "GEMM 1.84x, merge sort 1.5x, GNN 1.84x faster than synchronous I/O".
- Ratel (LLM fine-tuning): "2.32x throughput vs ZeRO-Infinity on 13B; 175B on a 24 GB GPU + 256 GB RAM".
- Hyperion (out-of-core GNN): ">3.1x TPC vs out-of-core baselines; in-memory-like throughput".
- DisDP (disaggregated data parallel): "3.98x vs SOTA on 175B with 8 GPUs".
- DaCe (Ziogas et al., SC'21, abstract): "2.47x and 3.75x speedups over previous-best solutions"
  (CPU and GPU; the abstract lists CPU, GPU, FPGA and Piz Daint) and "up to 93.16% scaling
  efficiency on 512 nodes" (Piz Daint).
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

GPU_NVME = "a GPU server with NVMe SSDs (the paper's testbed)"
HERE_2CORE = ("this machine has 2 CPU cores and one virtual disk; compute is the CPU, "
              "so ratios that depend on a GPU's speed relative to the SSD differ")


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    id: str
    #: harness suite that measures it (io, kernels, llm, gnn, dist, dace)
    suite: str
    #: benchmark inside the suite whose result holds the field (a bench name, or "dace")
    benchmark: str
    title: str
    #: "paper" (a published figure) or "project" (a target the project set itself, named by issue)
    source: str
    #: the paper's words or the project's target, quoted
    paper_figure: str
    paper_value: float | None = None
    paper_hardware: str = ""
    #: dotted path into the result (None: this machine cannot measure it, see ``differs_because``)
    field: str | None = None
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

    def __post_init__(self) -> None:
        if self.comparison not in (">=", "<=", "=="):
            raise ValueError(f"claim {self.id}: comparison: must be '>=', '<=' or '==', got {self.comparison!r}")
        if self.aggregate not in (None, "max", "min", "mean"):
            raise ValueError(f"claim {self.id}: aggregate: must be max, min, mean or None")
        if self.source not in ("paper", "project"):
            raise ValueError(f"claim {self.id}: source: must be 'paper' or 'project'")
        if self.field is None and not self.differs_because:
            raise ValueError(f"claim {self.id}: differs_because: a claim not measured here must say why")


CLAIMS: tuple[Claim, ...] = (
    # ------------------------------------------------------------------ io (CAM storage engine)
    Claim(id="io.seq_read", suite="io", benchmark="io", title="1 MiB sequential read at the device's speed",
          source="project", paper_figure="issue 2: >= 0.90 of fio on the same file", field="seq_read_vs_fio",
          baseline="fio, same file, same queue depth", target=0.90,
          differs_because="a virtual disk's rate varies from run to run (the log gives every pair)"),
    Claim(id="io.seq_write", suite="io", benchmark="io", title="1 MiB sequential write at the device's speed",
          source="project", paper_figure="issue 2: >= 0.90 of fio", field="seq_write_vs_fio",
          baseline="fio, same file", target=0.90, differs_because="a virtual disk's write rate varies from run to run, fio's as much as "
                          "terastack's (the log gives every pair)"),
    Claim(id="io.seq_read_huge_pages", suite="io", benchmark="io",
          title="1 MiB sequential read from terastack's own (huge-page) buffers", source="project",
          paper_figure="issue 2: transfers at the device's speed", field="seq_read_huge_pages_vs_fio",
          baseline="fio with its default (4 KiB-page) buffers, same file", target=None,
          differs_because="reported: what the allocator's huge pages add (fewer DMA segments and page pins)"),
    Claim(id="io.seq_write_huge_pages", suite="io", benchmark="io",
          title="1 MiB sequential write from terastack's own (huge-page) buffers", source="project",
          paper_figure="issue 2: transfers at the device's speed", field="seq_write_huge_pages_vs_fio",
          baseline="fio with its default (4 KiB-page) buffers, same file", target=None,
          differs_because="reported: what the allocator's huge pages add (fewer DMA segments and page pins)"),
    Claim(id="io.rand4k", suite="io", benchmark="io", title="4 KiB random read, queue depth 64",
          source="project", paper_figure="issue 2: >= 0.85 of fio", field="rand4k_read_vs_fio",
          baseline="fio, same file, QD 64", target=0.85, differs_because="a virtual disk's IOPS vary from run to run"),
    Claim(id="io.batch_submit", suite="io", benchmark="io", title="small-request submission rate (batch API)",
          source="project", paper_figure="issue 2: >= 1,000,000 ops/s, page cache hot",
          field="batch_submit_ops_per_s", baseline="none (absolute rate on 2 cores)", target=1e6, unit="ops/s",
          differs_because="2 cores bound the rate"),
    # ------------------------------------------------------------------ kernels (CAM proof workloads)
    Claim(id="cam.gemm", suite="kernels", benchmark="gemm", title="out-of-core GEMM, I/O overlapped",
          source="paper", paper_figure="CAM: GEMM 1.84x faster than synchronous I/O", paper_value=1.84,
          paper_hardware=GPU_NVME, field="speedup_vs_sync", baseline="same tiling, synchronous read/compute/write",
          target=1.84,
          differs_because="overlap can at best turn compute + I/O into max(compute, I/O): the bound is "
                          "(c + i) / max(c, i) <= 2, reached only when both are equal; see hidden_fraction. "
                          + HERE_2CORE),
    Claim(id="cam.gemm_hidden", suite="kernels", benchmark="gemm", title="GEMM: fraction of the smaller side hidden",
          source="project", paper_figure="issue 2: hidden_fraction >= 0.8", field="hidden_fraction",
          baseline="compute alone and I/O alone, same run", target=0.8, unit="fraction",
          differs_because="compute and I/O share the same 2 cores here"),
    Claim(id="cam.sort", suite="kernels", benchmark="sort", title="external merge sort, I/O overlapped",
          source="paper", paper_figure="CAM: merge sort 1.5x faster than synchronous I/O", paper_value=1.5,
          paper_hardware=GPU_NVME, field="speedup_vs_sync", baseline="same sort, synchronous I/O", target=1.5,
          differs_because="on 2 cores sorting is compute-bound, so the I/O to hide is small and the speedup "
                          "bound (c + i) / max(c, i) is close to 1. " + HERE_2CORE),
    Claim(id="cam.sort_hidden", suite="kernels", benchmark="sort", title="sort: fraction of the smaller side hidden",
          source="project", paper_figure="issue 2: hidden_fraction >= 0.8", field="hidden_fraction",
          baseline="run formation + merge alone and I/O alone", target=0.8, unit="fraction",
          differs_because="compute and I/O share the same 2 cores here"),
    # ------------------------------------------------------------------ llm (Ratel)
    Claim(id="ratel.zero_infinity", suite="llm", benchmark="llm", title="fine-tuning throughput vs ZeRO-Infinity",
          source="paper", paper_figure="Ratel: 2.32x throughput vs ZeRO-Infinity on a 13B model", paper_value=2.32,
          paper_hardware="one 24 GB consumer GPU, 256 GB RAM, NVMe SSDs", field="speedup_vs_zero_infinity",
          baseline="DeepSpeed ZeRO-Infinity (ZeRO-3, params + optimizer on NVMe), same model and machine",
          target=1.8,
          differs_because="here a ~150M model on CPU (no GPU): the overlap of CPU Adam with GPU backward that "
                          "Ratel exploits becomes CPU-with-CPU; the project's target is 1.8x"),
    Claim(id="ratel.in_memory", suite="llm", benchmark="llm", title="slowdown vs plain in-memory training",
          source="project", paper_figure="issue 3: <= 1.15", field="slowdown_vs_in_memory", comparison="<=",
          baseline="plain PyTorch AdamW with everything in memory", target=1.15,
          differs_because="most of the state lives on the SSD (the issue's budget): each step reads and writes it "
                          "(about 2.9 GB at the default size) and runs AdamW over every parameter on the same 2 "
                          "cores that run forward and backward; the planner names the bottleneck in the result"),
    Claim(id="ratel.175b", suite="llm", benchmark="llm", title="175B fine-tuning on one 24 GB GPU + 256 GB RAM",
          source="paper", paper_figure="Ratel: 175B on a 24 GB GPU + 256 GB RAM",
          paper_hardware="one 24 GB consumer GPU, 256 GB RAM, NVMe SSDs",
          differs_because="needs a 24 GB GPU, 256 GB RAM and several TB of SSD; this machine has 2 cores, 24 GiB",
          prediction_command="terastack plan llm --model opt-175b --gpu-mem 24GB --host-mem 256GB"),
    # ------------------------------------------------------------------ gnn (Hyperion; CAM's GNN figure)
    Claim(id="cam.gnn", suite="gnn", benchmark="gnn", title="GNN feature gathering vs synchronous I/O",
          source="paper", paper_figure="CAM: GNN 1.84x faster than synchronous I/O", paper_value=1.84,
          paper_hardware=GPU_NVME, field="speedup_vs_sync_gather",
          baseline="synchronous batched gathering through the same engine", target=1.84,
          differs_because="training a batch on 2 CPU cores is slow next to the SSD reads it overlaps. " + HERE_2CORE),
    Claim(id="hyperion.in_memory", suite="gnn", benchmark="gnn", title="out-of-core epoch vs in-memory epoch",
          source="paper", paper_figure="Hyperion: in-memory-like throughput; issue: slowdown <= 1.15 at features "
                                       "4x the budget", paper_hardware=GPU_NVME,
          field="slowdown_vs_in_memory_pipelined", comparison="<=", target=1.15,
          baseline="same model, features and topology in memory, fed through the same pipeline (same sampler, "
                   "threads, batch shapes, prefetch depth); the serial in-memory loop is "
                   "slowdown_vs_in_memory_serial", differs_because=HERE_2CORE),
    Claim(id="hyperion.mmap", suite="gnn", benchmark="gnn", title="out-of-core epoch vs np.memmap features",
          source="project", paper_figure="issue 4: >= 3x", field="speedup_vs_mmap", target=3.0,
          baseline="features in np.memmap under the same memory budget",
          differs_because="the page cache of a virtual disk behaves differently from a local NVMe drive"),
    Claim(id="hyperion.tpc_model", suite="gnn", benchmark="gnn", title="TPC model: predicted vs measured epoch time",
          source="project", paper_figure="issue 4: within 20% at three cache sizes", field="prediction_error",
          aggregate="max", comparison="<=", target=0.20, unit="fraction", baseline="measured epochs, same run",
          differs_because="the model leaves out what the pipeline's stages still share (the interpreter "
                          "lock, memory bandwidth) and any other work on the cores"),
    Claim(id="hyperion.accuracy", suite="gnn", benchmark="gnn", title="accuracy equal to in-memory training",
          source="project", paper_figure="issue 4: within 1 point", field="accuracy_diff_points", comparison="<=",
          target=1.0, unit="points", baseline="in-memory training, same seed",
          differs_because="should not differ: features are bit-identical"),
    Claim(id="hyperion.tpc", suite="gnn", benchmark="gnn", title="throughput per cost vs out-of-core baselines",
          source="paper", paper_figure="Hyperion: >3.1x TPC vs out-of-core baselines", paper_value=3.1,
          paper_hardware=GPU_NVME,
          differs_because="TPC compares hardware configurations with prices; one machine here cannot measure it",
          prediction_command="terastack gnn advise --data DIR"),
    # ------------------------------------------------------------------ dist (DisDP)
    Claim(id="disdp.fsdp2", suite="dist", benchmark="dist", title="step time vs FSDP2 (2 CPU workers)",
          source="paper", paper_figure="DisDP: 3.98x vs SOTA on 175B with 8 GPUs", paper_value=3.98,
          paper_hardware="8 GPUs with SmartNIC/SmartSwitch offload, 175B model", field="speedup_vs_fsdp2",
          baseline="PyTorch FSDP2 (fully_shard) on a gloo CPU mesh, same model",
          differs_because="2 CPU workers on 2 cores with a small model: communication agents share the "
                          "cores they are meant to free; the paper's figure is at 175B/8 GPUs (see `dist simulate`)",
          prediction_command="terastack dist simulate --model opt-175b --gpus 8"),
    Claim(id="disdp.exposed_comm", suite="dist", benchmark="dist",
          title="exposed communication, terastack / FSDP2", source="project",
          paper_figure="issue 5: at most half of FSDP2's", field="exposed_comm_fraction.terastack",
          ratio_to="exposed_comm_fraction.fsdp2", comparison="<=", target=0.5, unit="ratio",
          baseline="FSDP2's exposed communication fraction, same run",
          differs_because="agents run on the same 2 cores as the workers"),
    Claim(id="disdp.equal", suite="dist", benchmark="dist", title="parameters equal single-process training",
          source="project", paper_figure="issue 5: max abs diff <= 1e-5", field="correct_within_1e-5",
          comparison="==", target=1, unit="bool", baseline="single-process AdamW, same data and seeds",
          differs_because="should not differ"),
    Claim(id="disdp.ingress_flat", suite="dist", benchmark="dist",
          title="server ingress per step flat in the number of workers (with the aggregator)", source="paper",
          paper_figure="DisDP: aggregation before the PS keeps its ingress flat", field="server_ingress_flat_with_aggregator",
          comparison="==", target=1, unit="bool", baseline="the same job without the aggregator (grows with workers)",
          differs_because="should not differ: it counts bytes, not time"),
    Claim(id="disdp.worker_state", suite="dist", benchmark="dist", title="optimizer bytes held by workers",
          source="project", paper_figure="issue 5: 0", field="worker_optimizer_bytes", comparison="==", target=0,
          unit="bytes", baseline="—", differs_because="should not differ"),
    # ------------------------------------------------------------------ dace (Ziogas et al., SC'21)
    Claim(id="dace.cpu_vs_best", suite="dace", benchmark="dace",
          title="DaCe CPU speedup over the best of NumPy and Numba (geometric mean over kernels)",
          source="paper", paper_figure="DaCe: 2.47x speedup over previous-best solutions (CPU)", paper_value=2.47,
          paper_hardware="a multi-core CPU node (model given in the paper, not transcribed here)",
          field="speedups.vs_best_other_geomean", baseline="per kernel, the faster of NumPy and Numba",
          target=2.47,
          differs_because="2 cores instead of a many-core node (DaCe's parallel maps have little to gain); "
                          "12+ kernels written here, not NPBench's 52; previous-best in the paper includes "
                          "Pythran and others not run here; DaCe uses OpenBLAS here"),
    Claim(id="dace.cpu_vs_numpy", suite="dace", benchmark="dace", title="DaCe speedup over NumPy (geometric mean)",
          source="project", paper_figure="issue 6: speedup over NumPy per kernel, reported",
          field="speedups.geomean.dace", baseline="NumPy, same inputs, same threads",
          differs_because="see the per-kernel table"),
    Claim(id="dace.numba_vs_numpy", suite="dace", benchmark="dace", title="Numba speedup over NumPy (geometric mean)",
          source="project", paper_figure="issue 6: reported", field="speedups.geomean.numba",
          baseline="NumPy, same inputs, same threads", differs_because="see the per-kernel table"),
    Claim(id="dace.validation", suite="dace", benchmark="dace", title="every framework's output equals NumPy's",
          source="project", paper_figure="issue 6: allclose with stated tolerances; failures reported",
          field="validation_failures", comparison="==", target=0, unit="failures",
          baseline="NumPy output, same inputs", differs_because="a failure is a compiler bug or a kernel bug"),
    Claim(id="dace.weak_scaling", suite="dace", benchmark="dace",
          title="weak-scaling efficiency at the largest process count (worst of gemm, atax, jacobi_2d)",
          source="paper", paper_figure="DaCe: up to 93.16% scaling efficiency on 512 nodes", paper_value=0.9316,
          paper_hardware="Piz Daint, up to 512 nodes (23,328 cores)", field="scaling_summary.weak_efficiency_min",
          baseline="the same kernel on 1 process", target=0.9316, unit="fraction",
          differs_because="P is at most the cores here (2), and the ranks share one memory system; the "
                          "rank-local kernels are DaCe-compiled but communication goes through mpi4py, where the paper's distributed programs are DaCe-generated end to end"),
    Claim(id="dace.gpu", suite="dace", benchmark="dace", title="DaCe GPU speedup over previous-best",
          source="paper", paper_figure="DaCe: 3.75x speedup over previous-best solutions (GPU)", paper_value=3.75,
          paper_hardware="an NVIDIA GPU (model given in the paper)",
          differs_because="no GPU (and no CUDA toolkit) on this machine"),
)
