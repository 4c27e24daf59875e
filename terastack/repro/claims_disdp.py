"""DisDP's claims (the disaggregated engine, ``terastack.disdp``): the ``dist`` suite's step time against the
model-sharded baselines, the mechanism's rows, and the collectives' interference.

A row of this table is a :class:`terastack.repro.claim.Claim`; :mod:`terastack.repro.claims` gathers every table.
"""
from __future__ import annotations

from terastack.repro.claim import Claim

DISDP_HARDWARE = "8 GPU workers with SmartNIC/SmartSwitch offload, 175B model"
CORES_SHARED = ("2 CPU workers on 2 cores with a small model: the communication agents that stand in for the "
                "SmartNICs share the cores they are meant to free; the paper's figure is at 175B on 8 GPUs (see "
                "`dist simulate`)")
STEP_FIGURES = ("step_s.terastack", "step_s.fsdp2", "step_s.zero3", "strongest_baseline")

DISDP_CLAIMS: tuple[Claim, ...] = (
    Claim(id="disdp.speedup", suite="dist", benchmark="dist",
          title="step time vs the stronger of FSDP2 and ZeRO-3 in the same run (2 CPU workers)",
          source="paper", paper="DisDP", where="abstract",
          paper_figure="\"DisDP on 8 distributed GPUs outperforms the state-of-the-art training systems by 3.98x "
                       "when training on a 175B model\"", paper_value=3.98, paper_hardware=DISDP_HARDWARE,
          field="speedup_vs_strongest_baseline",
          baseline="the faster, in this run, of PyTorch FSDP2 (fully_shard on a gloo CPU mesh) and terastack's "
                   "serial ZeRO-3 schedule, same model and data (strongest_baseline names it)",
          baseline_reason="the abstract does not name the state-of-the-art systems; FSDP2 is PyTorch's "
                          "model-sharded data parallelism and the serial ZeRO-3 schedule the paradigm the abstract "
                          "measures itself against (\"Model-sharded data parallelism (MSDP), e.g., ZeRO\"); the row "
                          "is judged against whichever stepped faster here, and disdp.fsdp2 and disdp.zero3 give "
                          "each",
          target_reason="reported only: the 3.98x comes from moving the optimizer and the collectives onto "
                        "SmartNIC/SmartSwitch hardware for a 175B model on 8 GPUs; on 2 CPU workers the agents "
                        "that stand in for that hardware share the cores they are meant to free, so no floor here "
                        "would test the design. disdp.exposed_comm judges the mechanism, and `dist simulate` "
                        "predicts the paper's configuration",
          evidence=STEP_FIGURES, differs_because=CORES_SHARED,
          prediction_command="terastack dist simulate --model opt-175b --gpus 8"),
    Claim(id="disdp.fsdp2", suite="dist", benchmark="dist", title="step time vs FSDP2 (2 CPU workers)",
          source="project", paper_figure="speedup over FSDP2, reported",
          rationale="FSDP2 is the model-sharded data parallelism PyTorch users reach for first; disdp.speedup is "
                    "judged against the faster of it and ZeRO-3",
          field="speedup_vs_fsdp2", baseline="PyTorch FSDP2 (fully_shard) on a gloo CPU mesh, same model",
          evidence=STEP_FIGURES, differs_because=CORES_SHARED),
    Claim(id="disdp.zero3", suite="dist", benchmark="dist", title="step time vs serial ZeRO-3 (2 CPU workers)",
          source="project", paper_figure="speedup over terastack's serial ZeRO-3 schedule, reported",
          rationale="the same buckets, hooks and data as terastack's job with every collective and the optimizer "
                    "on the compute thread: the design DisDP disaggregates, with nothing else changed",
          field="speedup_vs_zero3", baseline="terastack's serial ZeRO-3 schedule (terastack.disdp.zero3), same model",
          evidence=STEP_FIGURES, differs_because=CORES_SHARED),
    Claim(id="disdp.collective_interference", suite="dist", benchmark="dist-interference",
          title="a collective's own execution time beside compute and storage traffic, against alone (gloo "
                "all-reduces on this machine's cores)",
          source="paper", paper="DisDP", where="abstract",
          paper_figure="\"Although the collectives themselves only occupy fewer than 10% of GPU SMs, their execution "
                       "time increases by 41% due to the serial execution of aggregated CPU/GPU-managed compute "
                       "(i.e., GEMM), network (i.e., NCCL), and storage (i.e., optimizer states)\"",
          paper_value=0.41, unit="fraction", paper_hardware="GPUs running NCCL collectives beside GEMM kernels",
          field="collective_time_increase",
          target_reason="reported: how much a collective slows beside compute and storage belongs to the machine, "
                        "not to terastack; it is why terastack's communication agents take collectives off the "
                        "compute path. collective_cpu_share, printed beside, is the share of the cores the "
                        "collective's processes used, the counterpart of the paper's \"fewer than 10% of GPU SMs\"",
          baseline="the same all-reduces alone, just before and just after (mean of the two)",
          evidence=("collective_cpu_share", "compute_slowdown_beside_collective", "storage_gb_per_s_beside"),
          differs_because="the collective is gloo all-reduces between processes, the compute a matrix-product loop "
                          "and the storage traffic reads and writes of an optimizer-state file through terastack's "
                          "storage engine, all on this machine's 2 CPU cores, where the paper's are NCCL kernels "
                          "beside GEMM kernels on one GPU"),
    Claim(id="disdp.compute_interference", suite="dist", benchmark="dist-interference",
          title="the compute's slowdown beside the collective and the storage traffic", source="project",
          paper_figure="reported: the compute loop's time per matrix product beside them over alone",
          rationale="the other side of the interference DisDP's abstract measures: what the compute the workers "
                    "exist for loses while a collective and optimizer-state traffic share its machine",
          field="compute_slowdown_beside_collective",
          baseline="the same compute loop alone, just before and just after (mean of the two)",
          differs_because="compute, collective and storage traffic share this machine's 2 CPU cores"),
    Claim(id="disdp.ps_linear", suite="dist", benchmark="dist",
          title="one parameter server's throughput as workers grow: scaling efficiency at the most workers run",
          source="paper", paper="DisDP", where="abstract",
          paper_figure="\"a SmartSwitch-enhanced parameter server that allows a single PS to serve massive workers "
                       "with linear scalability\"",
          derived="linear scalability read as a scaling efficiency of 1.0", paper_value=1.0,
          field="ps_scaling_efficiency", unit="fraction",
          target_reason="reported: workers and server are processes sharing this machine's cores, and past "
                        "cores - servers workers (ps_scaling.workers_within_cores) a step's compute slows for want "
                        "of cores whatever the server takes in, so a linear floor here would judge the cores, not "
                        "the server; ps_scaling.by_workers gives the server's gradients and bytes per second at "
                        "every count",
          baseline="the same job with 1 worker and the same single server (the server-ingress runs without the "
                   "aggregator, so every worker's gradient reaches the server)",
          evidence=("ps_scaling.workers_within_cores",),
          differs_because="on 2 cores one worker and the server already fill the machine: every count past "
                          "ps_scaling.workers_within_cores measures the cores as much as the server"),
    Claim(id="disdp.exposed_comm", suite="dist", benchmark="dist",
          title="exposed communication, terastack / FSDP2", source="project",
          paper_figure="at most half of FSDP2's",
          rationale="the communication agents exist to take collectives off the compute path; if they do not "
                    "halve what the step waits for, they are not worth their processes",
          field="exposed_comm_fraction.terastack",
          ratio_to="exposed_comm_fraction.fsdp2", comparison="<=", target=0.5, unit="ratio",
          baseline="FSDP2's exposed communication fraction, same run",
          evidence=("exposed_comm_fraction.terastack", "exposed_comm_fraction.fsdp2"),
          differs_because="agents run on the same 2 cores as the workers"),
    Claim(id="disdp.equal", suite="dist", benchmark="dist", title="parameters equal single-process training",
          source="project", paper_figure="max abs diff <= 1e-5", field="correct_within_1e-5",
          rationale="a distributed job must train the same model as the single-process one "
                    "(docs/design.md: results must equal the single-process job)",
          comparison="==", target=1, unit="bool", baseline="single-process AdamW, same data and seeds",
          evidence=("max_abs_diff_vs_single_process",), differs_because="should not differ"),
    Claim(id="disdp.ingress_flat", suite="dist", benchmark="dist",
          title="server ingress per step flat in the number of workers (with the aggregator)", source="project",
          paper_figure="aggregation before the parameter server keeps its ingress flat in the number of workers",
          rationale="DisDP aggregates gradients in the network before its optimizer node, so that node's ingress "
                    "does not grow with the workers; terastack's aggregator stands in for that, and counting the "
                    "server's bytes shows whether it does",
          field="server_ingress_flat_with_aggregator",
          comparison="==", target=1, unit="bool", baseline="the same job without the aggregator (grows with workers)",
          differs_because="should not differ: it counts bytes, not time"),
    Claim(id="disdp.worker_state", suite="dist", benchmark="dist",
          title="optimizer state held by a worker process between steps, however it holds it",
          source="project", paper_figure="0 bytes",
          rationale="DisDP's abstract \"fully offloading storage to a SmartSwitch-enhanced parameter server\": "
                    "every optimizer state lives on the parameter-server shards, and a byte left on a worker is "
                    "memory the model cannot use",
          field="worker_state_bytes", comparison="==", target=0, unit="bytes",
          baseline="a census, once its steps are over, of every tensor and array the worker made and still holds, "
                   "its model's parameters, gradients and buffers excepted ([Note: state a worker holds]); FSDP2's "
                   "and ZeRO-3's workers, whose moments (and ZeRO-3's masters) it finds, are printed beside",
          evidence=("fsdp2_worker_state_bytes", "zero3_worker_state_bytes"),
          differs_because="should not differ: it counts bytes, not time"),
)
