"""The storage engine's claims (CAM's asynchronous, batched I/O): the ``io`` suite against fio, the ``kernels``
suite's proof workloads (out-of-core GEMM and external sort), and CAM's GNN figure, read in the ``gnn`` suite.

A row of this table is a :class:`terastack.repro.claim.Claim`; :mod:`terastack.repro.claims` gathers every table.
"""
from __future__ import annotations

from terastack.repro.claim import GPU_NVME, HERE_2CORE, Claim

#: why the storage engine's targets are ratios to fio: fio is the tool people measure their drives with
FIO = "fio is how users measure their drives; "

#: CAM's abstract, its figures and their baseline, quoted (its GNN, mergesort and GEMM figures, in that order)
CAM_WORDS = ("\"CAM can perform GNN model training, mergesort, and GEMM up to 1.84x, 1.5x, and 1.84x faster compared "
             "to the existing state-of-the-art GPU systems\"")
#: what stands in for the systems CAM's abstract compares with, and why its ratios are reported
CAM_BASELINE = ("CAM's abstract compares it with other GPU systems, which need a GPU driving an NVMe SSD; on this "
                "machine the strongest alternative is the same pipeline with every read awaited before the compute "
                "that needs it, so the ratio isolates what asynchronous, batched I/O adds")
CAM_REPORTED = ("reported beside the paper's figure, not judged against it: the paper's is an \"up to\" ratio over "
                "other GPU systems and this one is over terastack's own synchronous I/O, so neither is the other's "
                "floor; the overlap itself is judged, in a form any machine can check, by the *_hidden rows")
#: the hidden rows: what CAM's API is for, in its words, and why the share hidden is the form any machine can check
HIDDEN_RATIONALE = ("CAM's API lets programmers \"overlap GPU computation and SSD I/O operations\" (its abstract); "
                    "the speedup that buys depends on the machine's balance of compute and I/O, the share of the "
                    "smaller side the overlap hides does not, so it is the form of the claim any machine can check")
HIDDEN_FIGURES = ("compute_only_s", "io_only_s", "pipelined_s", "smaller_side_hidden_unclamped")

STORAGE_CLAIMS: tuple[Claim, ...] = (
    # ------------------------------------------------------------------ io (the storage engine against fio)
    Claim(id="io.seq_read", suite="io", benchmark="io", title="1 MiB sequential read at the device's speed",
          source="project", paper_figure=">= 0.90 of fio on the same file",
          rationale=FIO + "within 10% of it, the storage engine adds no cost a user would notice",
          field="seq_read_vs_fio", baseline="fio, same file, same queue depth", target=0.90,
          differs_because="a virtual disk's rate varies from run to run (the log gives every pair)"),
    Claim(id="io.seq_write", suite="io", benchmark="io", title="1 MiB sequential write at the device's speed",
          source="project", paper_figure=">= 0.90 of fio on the same file",
          rationale=FIO + "within 10% of it, checkpoints and stores write as fast as the drive allows",
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
          rationale=FIO + "GNN feature gathers are 4 KiB random reads, so their rate bounds an out-of-core epoch; "
                    "the margin is wider than for 1 MiB reads because each request costs CPU on both sides",
          field="rand4k_read_vs_fio", baseline="fio, same file, QD 64", target=0.85,
          differs_because="a virtual disk's IOPS vary from run to run"),
    Claim(id="io.batch_submit", suite="io", benchmark="io", title="small-request submission rate (batch API)",
          source="project", paper_figure=">= 1,000,000 ops/s, page cache hot",
          rationale="one Python call per request tops out near 0.5M ops/s; an NVMe drive serves about 1M 4 KiB "
                    "reads/s, so submission must not be what limits a batch (docs/design.md, the storage engine)",
          field="batch_submit_ops_per_s", baseline="none (absolute rate on 2 cores)", target=1e6, unit="ops/s",
          differs_because="2 cores bound the rate"),
    # ------------------------------------------------------------------ kernels (CAM proof workloads)
    Claim(id="cam.gemm", suite="kernels", benchmark="gemm", title="out-of-core GEMM, I/O overlapped",
          source="paper", paper="CAM", where="abstract",
          paper_figure=CAM_WORDS + " (GEMM: 1.84x)", paper_value=1.84, target_reason=CAM_REPORTED,
          paper_hardware=GPU_NVME, field="speedup_vs_sync", baseline="same tiling, synchronous read/compute/write",
          baseline_reason=CAM_BASELINE,
          differs_because="overlap can at best turn compute + I/O into max(compute, I/O): the bound is "
                          "(c + i) / max(c, i) <= 2, reached only when both are equal; see smaller_side_hidden. "
                          + HERE_2CORE),
    Claim(id="cam.gemm_hidden", suite="kernels", benchmark="gemm", title="GEMM: share of the smaller side hidden",
          source="project", paper_figure="(compute + I/O - pipelined) / min(compute, I/O) >= 0.8",
          rationale=HIDDEN_RATIONALE, field="smaller_side_hidden",
          baseline="compute alone and I/O alone, same run (their sum is what a run that hides nothing takes)",
          target=0.8, unit="fraction", evidence=HIDDEN_FIGURES,
          differs_because="compute and I/O share the same 2 cores here, so each slows the other when they overlap"),
    Claim(id="cam.sort", suite="kernels", benchmark="sort", title="external merge sort, I/O overlapped",
          source="paper", paper="CAM", where="abstract",
          paper_figure=CAM_WORDS + " (mergesort: 1.5x)", paper_value=1.5, target_reason=CAM_REPORTED,
          paper_hardware=GPU_NVME, field="speedup_vs_sync", baseline="same sort, synchronous I/O",
          baseline_reason=CAM_BASELINE,
          differs_because="on 2 cores sorting is compute-bound, so the I/O to hide is small and the speedup "
                          "bound (c + i) / max(c, i) is close to 1. " + HERE_2CORE),
    Claim(id="cam.sort_hidden", suite="kernels", benchmark="sort", title="sort: share of the smaller side hidden",
          source="project", paper_figure="(compute + I/O - pipelined) / min(compute, I/O) >= 0.8",
          rationale=HIDDEN_RATIONALE, field="smaller_side_hidden",
          baseline="run formation + merge alone and I/O alone, same run (their sum is what a run that hides "
                   "nothing takes)", target=0.8, unit="fraction", evidence=HIDDEN_FIGURES,
          differs_because="compute and I/O share the same 2 cores here, so each slows the other when they overlap"),
    # ------------------------------------------------------------------ gnn (CAM's GNN figure)
    Claim(id="cam.gnn", suite="gnn", benchmark="gnn",
          title="GNN feature gathering (not GNN training) vs synchronous gathering",
          source="paper", paper="CAM", where="abstract",
          paper_figure=CAM_WORDS + " (GNN model training: 1.84x)", paper_value=1.84,
          target_reason="this row measures the feature gathering of a GNN epoch (the storage engine's part), not "
                        "GNN training, so it cannot judge the paper's training figure; " + CAM_REPORTED,
          paper_hardware=GPU_NVME, field="speedup_vs_sync_gather",
          baseline="synchronous batched gathering through the same engine", baseline_reason=CAM_BASELINE,
          differs_because="training a batch on 2 CPU cores is slow next to the SSD reads it overlaps. " + HERE_2CORE),
)
