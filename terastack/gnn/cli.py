"""``terastack gnn``: gen, import, verify, train, infer, advise."""
from __future__ import annotations

import argparse
import json
import sys

from terastack.units import format_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="gnn_command", metavar="ACTION", required=True)
    _gen_args(sub)
    _import_args(sub)
    _verify_args(sub)
    _train_args(sub)
    _infer_args(sub)
    _advise_args(sub)


def _gen_args(sub) -> None:
    p = sub.add_parser("gen", help="generate a power-law (R-MAT) graph dataset in bounded memory (resumable)")
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--feat-dim", type=int, default=128)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-fraction", type=float, default=0.1)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--test-fraction", type=float, default=0.05)
    p.add_argument("--signal", type=float, default=2.0, help="norm of the class centroids in the features")
    p.add_argument("--noise", type=float, default=1.0, help="standard deviation of the feature noise")
    p.add_argument("--memory-budget", default="1GiB", help="host memory the generator may use")
    p.add_argument("--force", action="store_true", help="overwrite an existing dataset or interrupted build")
    _common(p)


def _import_args(sub) -> None:
    p = sub.add_parser("import", help="import an OGB / IGB / MAG240M dataset directory or .npy arrays into a dataset "
                                      "(resumable)")
    p.add_argument("--out", required=True)
    p.add_argument("--from", dest="source", metavar="DIR", help="dataset directory, layout detected: OGB "
                   "(raw/edge.csv.gz or raw/data.npz + split/; ogbn-mag's raw/num-node-dict.csv.gz), MAG240M "
                   "(mag240m_kddcup2021), IGB and IGBH (<root>/<size>/processed), or .npy arrays")
    p.add_argument("--split", help="OGB: split directory under split/ (default: the only one, or the dataset's)")
    p.add_argument("--label-set", choices=["19", "2K"], help="IGB: label file (default: the first present)")
    p.add_argument("--split-seed", type=int, default=0, help="IGB: seed of the random 60/20/20 split (0: IGB's)")
    p.add_argument("--ogb-dir", help="directory with edge_index.npy, node_feat.npy, node_label.npy, split/*.npy")
    for name in ("edge-index", "indptr", "indices", "features", "labels", "train-idx", "val-idx", "test-idx"):
        p.add_argument(f"--{name}", help=f"{name.replace('-', '_')} .npy file")
    p.add_argument("--undirected", "--add-inverse-edges", action=argparse.BooleanOptionalAction, default=None,
                   help="add the reverse of every edge (--from default: as the dataset's loader does, e.g. OGB's "
                        "add_inverse_edge for ogbn_products; otherwise off)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16"])
    p.add_argument("--classes", type=int, default=None)
    p.add_argument("--memory-budget", default="1GiB")
    p.add_argument("--force", action="store_true")
    _common(p)


def _verify_args(sub) -> None:
    p = sub.add_parser("verify", help="check a dataset: sizes, structure and every checksum")
    p.add_argument("--data", required=True)
    p.add_argument("--json", action="store_true")


def _train_args(sub) -> None:
    from terastack.gnn.sampling.fanouts import accept_negative_lists
    from terastack.gnn.settings import GnnJob
    from terastack.training.job import add_job_arguments

    p = sub.add_parser("train", help="train a GNN out of core (unified cache + SSD, pipelined), either graph kind")
    p.add_argument("--config", default=None, metavar="FILE", help="a YAML or TOML job file: sections of settings "
                   "(sampling: {fanouts: 10,5}) or the flags' names at the top level (lr: 0.01); flags given on the "
                   "command line win over the file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="settings that win over the file and the flags, "
                   "e.g. lr=0.01 sampling.batch_size=512")
    accept_negative_lists(p)  # --fanouts -1,5 ([Note: negative fanout lists on the command line])
    add_job_arguments(p, job=GnnJob)
    o = p.add_argument_group("this run")
    o.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON of the pipeline (open in Perfetto)")
    _common(o)


def _job_args(p: argparse.ArgumentParser, only: tuple[str, ...]) -> None:
    """The flags of the GNN job settings ``only`` (terastack.gnn.settings), as ``gnn train`` takes them."""
    from terastack.gnn.sampling.fanouts import accept_negative_lists
    from terastack.gnn.settings import GnnJob
    from terastack.training.job import add_job_arguments

    accept_negative_lists(p)
    add_job_arguments(p, job=GnnJob, only=only)


def _job(args):
    """The GNN job the command line's setting flags make (each checked; the rest at their defaults)."""
    from terastack.gnn.settings import GnnJob
    from terastack.training.job import job_flags, resolve_job

    return resolve_job(file=getattr(args, "config", None), flags=job_flags(args),
                       overrides=getattr(args, "overrides", None) or [], job=GnnJob)


def _infer_args(sub) -> None:
    p = sub.add_parser("infer", help="predict every node with a trained model: layer-wise, full neighbourhoods, "
                                     "out of core")
    p.add_argument("--checkpoint", required=True, help="weights saved by `terastack gnn train --save-model`")
    p.add_argument("--out", default="", help="predictions (argmax, int64, one per node) as .npy")
    p.add_argument("--embeddings", default="", help="the last layer's output (logits, float32) as .npy")
    p.add_argument("--chunk-nodes", type=int, default=0, help="destination nodes computed at a time (0: 8192 on a "
                   "homogeneous graph, 1024 target nodes on a heterogeneous one, whose chunks hold their L-hop "
                   "neighbourhoods)")
    p.add_argument("--work-dir", default="", help="where layer outputs are written between layers "
                   "(default: beside --out)")
    _job_args(p, ("data.path", "data.verify", "data.topology", "cache.device_cache", "cache.host_cache",
                  "training.threads"))
    _common(p)


def _advise_args(sub) -> None:
    p = sub.add_parser("advise", help="predict epoch time and recommend hardware by throughput per cost (TPC)")
    _job_args(p, ("data.path", "model.kind", "model.hidden", "sampling.fanouts", "sampling.batch_size",
                  "cache.device_cache", "cache.host_cache", "training.threads"))
    p.add_argument("--prices", help="price table (TOML; default: the one shipped in terastack/plan/prices.toml)")
    p.add_argument("--ssds", default="1,2,4", help="SSD counts to consider, e.g. 1,2,4")
    p.add_argument("--memory", default=None, help="host memory sizes to consider in GiB (default: the table's)")
    p.add_argument("--gpus", default=None, help="GPU names to consider (default: every one in the table)")
    p.add_argument("--probe", default=None, help="probe JSON of this machine (default: cached, else measured)")
    p.add_argument("--no-calibrate", action="store_true", help="skip the timed training steps (FLOP estimate)")
    p.add_argument("--calibration-steps", type=int, default=5, help="timed training steps on sampled batches")
    p.add_argument("--json", action="store_true")


def _set_threads(threads: int) -> None:
    if threads:
        import torch

        from terastack.gnn.training.train import training_threads

        torch.set_num_threads(training_threads(threads))


def _common(p) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    return {"gen": _gen, "import": _import, "verify": _verify, "train": _train, "infer": _infer,
            "advise": _advise}[args.gnn_command](args)


def _emit(result: dict, as_json: bool, lines) -> None:
    if as_json:
        print(json.dumps(result, indent=1, default=str))
    else:
        for line in lines:
            print(line)


def _gen(args) -> int:
    from terastack.gnn.storage.gen import GraphGenerator

    return _build(GraphGenerator, args)


def _build(builder, args, **fields) -> int:
    """Run a dataset builder (the generator or an importer) with the flags of its Config's fields, and report."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(builder.Config)}
    given = {k: v for k, v in vars(args).items() if k in names}
    result = builder(builder.Config(**{**given, "progress": not args.quiet, **fields})).run()
    lines = [f"{result['status']}: {args.out} ({result.get('nodes', '?')} nodes, "
             f"{result.get('edges', '?')} edges) in {result['seconds']:.1f} s"]
    if "splits" in result:
        sizes = (f"{k.removesuffix('_idx')} {v:,}" for k, v in result["splits"].items())
        lines.append("  splits " + ", ".join(sizes))
    if result.get("unlabelled"):
        # the same count --json gives: nodes without a label rest with a placeholder class, in no split
        lines.append(f"  {result['unlabelled']:,} unlabelled nodes (in no split)")
    _emit(result, args.json, lines)
    return 0


def _import(args) -> int:
    from terastack.gnn.formats.detect import DirectoryImporter
    from terastack.gnn.importer import GraphImporter

    if args.source:
        return _build(DirectoryImporter, args)
    return _build(GraphImporter, args, undirected=bool(args.undirected))


def _verify(args) -> int:
    from terastack.gnn.storage.dataset import open_dataset
    from terastack.gnn.training.train import dataset_report

    ds = open_dataset(args.data, verify="full")
    ds.close()
    result = {**dataset_report(ds), "data": str(ds.root), "splits": {k: len(v) for k, v in ds.splits.items()}}
    size = "" if ds.hetero else f"features {format_bytes(ds.feature_bytes)}, "
    _emit(result, args.json, [f"ok: {ds!r}", f"  {size}splits {result['splits']}, {ds.verified}"])
    return 0


def _train(args) -> int:
    from terastack import trace
    from terastack.gnn.training.multi_process import run_training
    from terastack.training.interrupt import INTERRUPTED_EXIT, JobInterrupted, terminate_as_exit

    job = _job(args)
    _set_threads(job.training.threads)
    if args.trace:
        trace.tracer.start()
    try:
        with terminate_as_exit():
            result = run_training(job, progress=not args.quiet, argv=getattr(args, "_argv", None))
    except JobInterrupted as exc:
        print(exc, file=sys.stderr)  # where the run stood and the command that resumes it
        return INTERRUPTED_EXIT
    finally:
        if args.trace:
            trace.tracer.stop()
            print(f"trace written to {trace.tracer.save(args.trace)}", file=sys.stderr)
    if result is None:  # a rank other than 0 of an outer torchrun: rank 0 reports
        return 0
    _emit(result, args.json, _train_lines(result) + _rank_lines(result))
    return 0


def _train_lines(result: dict) -> list[str]:
    d, split, topo = result["dataset"], result["topology"]["split"], result["topology"]
    kinds = f"target {d['target']}, {len(d['nodes'])} node types, {len(d['edges'])} relations, " if "target" in d \
        else ""
    lines = [f"dataset {d['root']}: {kinds}{_total(d['nodes'])} nodes ({d['verified']})"]
    caches = [f"{t} {c['device_rows']} + {c['host_rows']}" for t, c in result["cache"]["types"].items()
              if "device_rows" in c]
    lines.append(f"cache: rows in the device + host tiers: {', '.join(caches)}; lists "
                 f"{format_bytes(_total(split.get('list_bytes', {})))} (topology {topo['topology']})")
    for e in result["epochs"]:
        lines.append(f"epoch {e['epoch']}: {e['seconds']:.2f} s, {e['batches_per_s']:.1f} batches/s, loss "
                     f"{e['loss_mean']:.4f}, hits device {e['device_hit_rate']:.1%} host {e['host_hit_rate']:.1%} "
                     f"miss {e['miss_rate']:.1%}, SSD {e['ssd_GBps']:.3f} GB/s, topology hits "
                     f"{e['topology_hit_rate']:.1%}{_accuracies(e)}")
    if not result["epochs"] and result["test_acc"] is not None:
        lines.append(f"untrained model:{_accuracies(result)}")
    if result["saved_model"]:
        lines.append(f"model saved to {result['saved_model']}")
    return lines


def _total(value) -> int:
    return sum(value.values()) if isinstance(value, dict) else value


def _rank_lines(result: dict) -> list[str]:
    r = result.get("ranks", {})
    if r.get("world_size", 1) < 2:
        return []
    synced = f"; parameters compared after {r['steps_checked']} steps, largest difference {r['max_param_diff']:g}" \
        if "steps_checked" in r else ""
    return [f"{r['world_size']} ranks (DistributedDataParallel), each on its share of every batch{synced}"]


def _accuracies(r: dict) -> str:
    return "".join(f", {name} acc {r[f'{name}_acc']:.4f}" for name in ("train", "val", "test")
                   if r.get(f"{name}_acc") is not None)


def _infer(args) -> int:
    from terastack.gnn.training.infer import GnnInference

    job = _job(args)
    cfg = GnnInference.Config(data=job.data.path or "", checkpoint=args.checkpoint, out=args.out,
                              embeddings=args.embeddings, chunk_nodes=args.chunk_nodes,
                              device_cache=job.cache.device_cache, host_cache=job.cache.host_cache,
                              work_dir=args.work_dir, topology=job.data.topology, verify=job.data.verify,
                              progress=not args.quiet)
    _set_threads(job.training.threads)
    result = GnnInference(cfg).run()
    d, layers = result["dataset"], result["layers"]
    nodes = f"{d['nodes'][d['target']]} {d['target']} nodes" if "target" in d else f"{d['nodes']} nodes"
    timed = ", ".join(f"{la['seconds']:.2f} s" for la in layers)
    lines = [f"{nodes}{f', {len(layers)} layers ({timed})' if layers else ''} in {result['seconds']:.2f} s; input "
             f"rows from the cache {1 - result['input_reads']['miss_rate']:.1%}"]
    lines += [f"{name} written to {result[name]}" for name in ("out", "embeddings") if result[name]]
    if result["out"]:
        lines.append(f"full-neighbourhood accuracy:{_accuracies(result)[1:]}")
    _emit(result, args.json, lines)
    return 0


def _advise(args) -> int:
    from terastack.gnn.advise import feature_file_hardware, probe_feature_file, workload
    from terastack.gnn.sampling.hotness import presample
    from terastack.gnn.sampling.sampler import NeighborSampler
    from terastack.gnn.storage.dataset import open_dataset
    from terastack.io import get_engine
    from terastack.plan.hardware import Hardware
    from terastack.plan.tpc import PriceTable, advise, predict_epoch

    job = _job(args)
    if not job.data.path:
        raise ValueError("data: a dataset directory is required (--data DIR)")
    _set_threads(job.training.threads)  # calibrate the step as `gnn train` will run it
    try:
        ssds = [int(s) for s in args.ssds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"ssds: expected comma-separated counts such as 1,2,4; got {args.ssds!r}") from None
    memory = [float(m) for m in args.memory.split(",")] if args.memory else None
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else None
    prices = PriceTable.load(args.prices)
    ds = open_dataset(job.data.path)
    if ds.hetero:
        raise ValueError(f"data: {ds.root} is a heterogeneous dataset; `terastack gnn advise` predicts the epochs of "
                         "homogeneous ones (one feature file, one relation); `terastack bench gnn --hetero` measures "
                         "and predicts a heterogeneous epoch")
    batch_size = job.sampling.batch_size
    sampler = NeighborSampler(dataset=ds, fanouts=job.sampling.fanouts)
    if len(ds.splits["train"]) == 0:
        raise ValueError(f"{ds.paths['train_idx']}: the training split is empty")
    hot = presample(sampler, ds.splits["train"], batch_size, epochs=2)[ds.target]
    ssd = probe_feature_file(ds)  # this SSD, this file, this file system: IOPS, bandwidth, kernel CPU per read
    wl = workload(ds, hot, batch_size=batch_size, model=job.model.kind, hidden=job.model.hidden, layers=sampler.hops,
                  calibrate=not args.no_calibrate, calibration_steps=args.calibration_steps,
                  io_cpu_seconds_per_block=ssd["io_cpu_seconds_per_block"])
    if args.probe:
        from pathlib import Path

        probe = Hardware.from_dict(json.loads(Path(args.probe).read_text()))
    else:
        from terastack.probe import load_or_measure

        probe = load_or_measure(str(ds.root))
    import dataclasses

    # the dataset's own file measures reads of one block: the gather's request when a row fits one; wider rows
    # take the probe's figures per request size where it has them (terastack.plan.read_rates)
    own = feature_file_hardware(ssd, where=ds.features_path.name)
    wide = max(1.0, wl.blocks_per_miss) > 1 and probe.ssd_random_reads
    here_hw = dataclasses.replace(probe, name=f"{probe.name}; SSD measured on {ds.features_path.name}",
                                  ssd_read_bytes_per_s=ssd["ssd_read_bytes_per_s"],
                                  ssd_rand4k_iops=ssd["ssd_rand4k_iops"], ssds=1,
                                  ssd_random_reads=probe.ssd_random_reads if wide else own.ssd_random_reads)
    here = predict_epoch(wl, here_hw, device_cache=job.cache.device_cache, host_cache=job.cache.host_cache,
                         gpu_efficiency=prices.gpu_efficiency, train_threads=wl.compute_threads,
                         queue_depth=get_engine().config.queue_depth)  # the depth the gather will read at
    result = advise(wl, probe, prices, ssd_counts=ssds, memory_gib=memory, gpus=gpus)
    result["this_machine"] = {"hardware": here_hw.name, "measured": probe.measured, **here.to_dict()}
    result["workload"] = {"batches_per_epoch": wl.batches_per_epoch, "nodes_per_batch": wl.nodes_per_batch,
                          "sample_seconds": wl.sample_seconds, "compute_seconds": wl.compute_seconds,
                          "flops_per_batch": wl.flops_per_batch, "feature_bytes": wl.feature_bytes}
    lines = [f"{here_hw.name}, cache {format_bytes(job.cache.device_cache)} device + "
             f"{format_bytes(job.cache.host_cache)} host: "
             f"predicted epoch {here.epoch_seconds:.2f} s, hit rate {here.hit_rate:.1%}, "
             f"bottleneck {here.bottleneck}",
             f"SSD reads priced at {here.ssd_rate.bytes_per_s / 1e9:.2f} GB/s: {here.ssd_rate_source}",
             f"candidates ({result['tpc_unit']}; {result['label']}):"]
    for c in result["candidates"][:10]:
        lines.append(f"  {c['epochs_per_usd']:10.1f}  {c['gpu']:22s} {c['ssds']} SSD  {c['memory_gib']:5.0f} GiB  "
                     f"${c['cost_usd']:8.0f}  epoch {c['epoch_seconds']:8.2f} s  bottleneck {c['bottleneck']}")
    b = result["best"]
    lines.append(f"recommended: {b['gpu']} + {b['ssds']} SSD + {b['memory_gib']:g} GiB "
                 f"({b['epochs_per_usd']:.1f} epochs per USD; bottleneck {b['bottleneck']})")
    _emit(result, args.json, lines)
    return 0
