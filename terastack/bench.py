"""``terastack bench NAME``: each benchmark measures terastack against its baseline in the same run.

A benchmark module provides ``add_arguments(parser)``, ``measure(args) -> dict``
and ``HEADLINE`` (the ratio fields printed first). Every result is stamped
with the machine, the versions and the command; ``--json`` prints it whole,
``--save FILE`` writes it, ``--trace FILE`` writes a Chrome trace.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from terastack import trace
from terastack.commands import Command, add_subcommands
from terastack.reporting import dumps, environment, print_result

BENCHMARKS = [
    Command("io", "terastack.io.bench.rates", "1 MiB sequential read/write, 4 KiB random read and batch submission vs fio"),
    Command("io-cpu", "terastack.io.bench.cpu",
            "CPU the storage engine spends per GB/s of cold random reads, at the disk's rate"),
    Command("gemm", "terastack.kernels.bench.gemm_pipeline", "out-of-core GEMM, pipelined vs synchronous tiles"),
    Command("sort", "terastack.kernels.bench.external_sort", "external merge sort of 64-bit keys, I/O overlapped"),
    Command("llm", "terastack.llm.bench.bench_llm", "offloaded fine-tuning vs ZeRO-Infinity and in-memory PyTorch",
            needs=("transformers",)),
    Command("llm-scale", "terastack.llm.bench.bench_scale",
            "the largest model each system fine-tunes in a fixed memory budget", needs=("transformers",)),
    Command("gnn", "terastack.gnn.bench.measure", "out-of-core GNN training vs in-memory, mmap and synchronous gathering",
            needs=("torch_geometric",)),
    Command("dist", "terastack.disdp.bench.measure", "disaggregated sharded data parallel vs FSDP2 and serial ZeRO-3",
            needs=("transformers",), extra="dist"),
    Command("dist-interference", "terastack.disdp.bench.interference",
            "a collective's own time beside compute and storage traffic, against alone (gloo, same cores)"),
]


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--save", metavar="FILE", help="also write the JSON result to FILE")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON (open in Perfetto)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_subcommands(parser, BENCHMARKS, dest="benchmark", metavar="BENCHMARK", required=True,
                    module_key="_bench_module", common=add_common_arguments)


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(args._bench_module)
    if args.trace:
        trace.tracer.start()
    try:
        result = module.measure(args)
    finally:
        if args.trace:
            trace.tracer.stop()
            path = trace.tracer.save(args.trace)
            print(f"trace written to {path}", file=sys.stderr)
    from terastack.io.backend import backend_record

    result["environment"] = environment(io_backend=backend_record())
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(dumps(result) + "\n")
    if args.json:
        print(dumps(result))
    else:
        print_result(result, title=f"terastack bench {args.benchmark}", headline=getattr(module, "HEADLINE", None))
    return 0
