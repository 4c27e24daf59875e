"""``terastack dist``: ``train`` (the job file of ``terastack finetune``, on workers, agents, an aggregator and
parameter servers), ``demo`` (random tokens, the engine's mechanism and its benchmark) and ``simulate`` (the
step-time model).

    terastack dist train --config job.yaml disdp.workers=2 servers=1    # launches torchrun locally (loopback)
    terastack dist train --config job.yaml --batch-size 8 --output out
    torchrun --nnodes 2 --nproc-per-node 3 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m terastack dist train --config job.yaml workers=4 servers=1   # on each node: 4 + 1 + the aggregator = 2 x 3
    terastack dist demo --workers 2 --servers 1 --steps 20            # random tokens
    terastack dist simulate --model 175b --gpus 8 --gpu-tflops 312 --nic-gbps 25 --servers 2
"""
from __future__ import annotations

import argparse
import os
import sys

from terastack.reporting import dumps


def _job_arguments(p: argparse.ArgumentParser) -> None:
    from terastack.training.job import add_job_arguments

    p.add_argument("--config", default=None, metavar="FILE",
                   help="a YAML or TOML job file, as terastack finetune reads it (its disdp: section sets the "
                        "roles); flags given on the command line win over the file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings that win over the file and the flags, e.g. lr=1e-5 disdp.workers=3")
    add_job_arguments(p, skip=("offload",))   # the offloaded engine's own knobs (terastack finetune)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    from terastack.disdp.train_config import TrainConfig

    d = TrainConfig()
    p.add_argument("--config", metavar="TOML", help="read settings from a TOML file ([train] table); flags override")
    g = p.add_argument_group("roles")
    g.add_argument("--workers", type=int, help=f"data-parallel workers (default {d.workers})")
    g.add_argument("--servers", type=int, help=f"parameter-server shards (default {d.servers})")
    g.add_argument("--no-aggregator", dest="aggregator", action="store_const", const=False,
                   help="agents send gradient slices straight to the servers (server ingress grows with workers)")
    g.add_argument("--agents", choices=("thread", "process"), help=f"communication agent per worker (default "
                                                                    f"{d.agents})")
    g = p.add_argument_group("model and data")
    g.add_argument("--model", help=f"toy, tiny-llama or a Hugging Face model directory (default {d.model})")
    for name in ("dim", "layers", "vocab", "heads", "seq-len", "micro-batch", "steps", "seed"):
        g.add_argument(f"--{name}", type=int, help=f"(default {getattr(d, name.replace('-', '_'))})")
    g = p.add_argument_group("optimizer (AdamW on the servers)")
    for name in ("lr", "beta1", "beta2", "eps", "weight-decay"):
        g.add_argument(f"--{name}", type=float, help=f"(default {getattr(d, name.replace('-', '_'))})")
    g.add_argument("--state", choices=("memory", "ssd"), help=f"where servers keep fp32 weights' AdamW moments "
                                                               f"(default {d.state})")
    g = p.add_argument_group("run")
    g.add_argument("--run-dir", help=f"checkpoints, statistics and scratch (default {d.run_dir})")
    g.add_argument("--checkpoint-every", type=int, help="checkpoint every N steps (default: after the last step)")
    g.add_argument("--resume", action="store_const", const=True, help="continue from the last checkpoint")
    g.add_argument("--prefetch", type=int, help=f"bucket deliveries an agent runs ahead (default {d.prefetch})")
    g.add_argument("--no-reshard", dest="reshard", action="store_const", const=False,
                   help="keep each layer from its forward to its backward instead of fetching it twice")
    g.add_argument("--timeout", dest="timeout_s", type=float, help=f"bound on every wait, seconds (default "
                                                                    f"{d.timeout_s:g})")
    g.add_argument("--threads", type=int, help="torch threads per process (default 1)")
    g.add_argument("--kill-at", metavar="ROLE:INDEX:STEP[:FAULT]",
                   help="fault injection: SIGKILL that rank at that step (FAULT kill), or make it hang (FAULT hang)")
    g.add_argument("--trace", dest="trace_dir", metavar="DIR", help="write a Chrome trace per rank into DIR")
    g.add_argument("--census", action="store_const", const=True,
                   help="report the state a worker holds between steps beyond its model (scans every object: seconds "
                        "per worker)")
    g.add_argument("--json", action="store_true", help="print the job's figures as JSON")


def _simulate_arguments(p: argparse.ArgumentParser) -> None:
    from terastack.plan import cluster

    cluster.add_arguments(p)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dist_command", metavar="{train,demo,simulate}", required=True)
    _job_arguments(sub.add_parser("train", help="run a job file (as terastack finetune) with workers, agents, an "
                                  "aggregator and parameter servers", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter))
    _demo_arguments(sub.add_parser("demo", help="train on random tokens with workers, agents, an aggregator and "
                                   "parameter servers (the mechanism, and what bench dist measures)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    _simulate_arguments(sub.add_parser("simulate", help="step-time model: standard MSDP vs the disaggregated "
                                                        "design (a labelled prediction)"))


def config_from_args(args: argparse.Namespace):
    from terastack.disdp.train_config import TrainConfig

    base = TrainConfig.from_toml(args.config).to_dict() if args.config else {}
    for name in TrainConfig.FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            base[name] = value
    return TrainConfig.from_dict(base, source=args.config or "command line")


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run(args: argparse.Namespace) -> int:
    if args.dist_command == "simulate":
        from terastack.plan import cluster

        return cluster.run(args)
    if args.dist_command == "train":
        return run_job(args)
    from terastack.disdp.launch import launch_local
    from terastack.disdp.run import run_role

    config = config_from_args(args)
    if _under_torchrun():
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(run_role)(config)
    result = launch_local(config)
    if args.json:
        result.pop("per_rank", None)
        print(dumps(result))
    else:
        held = ("" if "worker_state_bytes" not in result else
                f", state a worker holds beyond its model {result['worker_state_bytes']:,} B")
        print(f"step {result.get('step_s', float('nan')):.4f} s (median), exposed communication "
              f"{100 * result.get('exposed_comm_fraction', float('nan')):.1f}% of the step, server ingress "
              f"{result.get('server_ingress_bytes_per_step', 0):,} B/step{held}", file=sys.stdout)
    return 0




def run_job(args: argparse.Namespace) -> int:
    """``dist train``: the job of the file, flags and overrides; launched here, or one rank under torchrun."""
    from terastack.disdp.job_run import check_job, launch_job, run_torchrun_rank
    from terastack.training.interrupt import INTERRUPTED_EXIT, JobInterrupted
    from terastack.training.job import job_flags, other_engine_note, resolve_job

    job = resolve_job(file=args.config, flags=job_flags(args), overrides=args.overrides or [])
    check_job(job)
    note = other_engine_note(job, "offload", command="terastack dist train")  # [Note: settings of the other engine]
    if note and os.environ.get("RANK", "0") == "0":   # said once, not by every rank torchrun starts
        print(note, file=sys.stderr)
    if _under_torchrun():   # one rank of a job torchrun started, on this node or several
        from terastack.process_end import end_without_teardown

        end_without_teardown(run_torchrun_rank(job))   # [Note: a process leaves without teardown]
    try:
        result = launch_job(job, argv=getattr(args, "_argv", None))
    except JobInterrupted as exc:   # every rank has left in order; where to continue from, in one line
        print(exc, file=sys.stderr)
        return INTERRUPTED_EXIT
    if args.json:
        print(dumps(result))
    elif result["losses"]:
        print(f"loss {result['loss_first']:.4f} -> {result['loss_last']:.4f} over {len(result['losses'])} steps, "
              f"{result['step_s_mean']:.3f} s/step"
              + (f"; validation loss {result['val_loss_last']:.4f}" if result["val_loss_last"] is not None else "")
              + (f"; exported to {result['exported']}" if result["exported"] else ""))
    return 0
