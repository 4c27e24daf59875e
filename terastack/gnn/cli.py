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
    p = sub.add_parser("train", help="train a GNN out of core (unified cache + SSD, pipelined)")
    _training_args(p)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replace", action="store_true", help="sample neighbours with replacement")
    p.add_argument("--sync", action="store_true", help="no overlap: sample, gather, train one after another")
    p.add_argument("--depth", type=int, default=1, help="batches each pipeline queue holds")
    p.add_argument("--samplers", type=int, default=0, help="sampler threads, each sampling every N-th batch "
                   "(batches stay in order and identical); 0: 2 with --topology ssd (a sampler mostly waits for "
                   "its reads there), else 1")
    p.add_argument("--eval-nodes", type=int, default=4096,
                   help="validation and test nodes (each) scored after every epoch (-1: all, 0: none)")
    p.add_argument("--save-model", metavar="PATH", default="",
                   help="write the trained model's weights to PATH (e.g. model.pt) and its description to "
                        "PATH.json (model.pt.json), for `terastack gnn infer`")
    p.add_argument("--verify", default="stamp", choices=["stamp", "full", "size"])
    p.add_argument("--topology", default="memory", choices=["memory", "mmap", "ssd"],
                   help="read the CSC topology into memory, map it (pages come from SSD on demand), or leave it "
                        "on the SSD (read per hop through the storage engine, hot lists cached out of --host-cache)")
    p.add_argument("--indptr", default="auto", choices=["auto", "memory", "ssd"],
                   help="with --topology ssd: indptr in memory (compact, about 2.1 bytes per node), on the SSD, or "
                        "auto (in memory when the compact form costs at most a quarter of --host-cache)")
    p.add_argument("--device", default="auto")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel ranks on this machine (DDP; gloo on the CPU): "
                   "each trains on its share of every batch's seeds; under an outer torchrun, one rank per process")
    p.add_argument("--check-sync", action="store_true", help="with several ranks: gather every rank's parameters "
                   "after every step and report the largest difference (ranks.max_param_diff)")
    _threads_arg(p)
    p.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON of the pipeline (open in Perfetto)")
    _common(p)


def _infer_args(sub) -> None:
    p = sub.add_parser("infer", help="predict every node with a trained model: layer-wise, full neighbourhoods, "
                                     "out of core")
    p.add_argument("--data", required=True, help="dataset directory")
    p.add_argument("--checkpoint", required=True, help="weights saved by `terastack gnn train --save-model`")
    p.add_argument("--out", default="", help="predictions (argmax, int64, one per node) as .npy")
    p.add_argument("--embeddings", default="", help="the last layer's output (logits, float32) as .npy")
    p.add_argument("--chunk-nodes", type=int, default=0, help="destination nodes computed at a time (0: 8192 on a "
                   "homogeneous graph, 1024 target nodes on a heterogeneous one, whose chunks hold their L-hop "
                   "neighbourhoods)")
    p.add_argument("--device-cache", default="0", help="device-tier cache budget for the input features")
    p.add_argument("--host-cache", default="256MiB", help="host-tier cache budget for the input features")
    p.add_argument("--work-dir", default="", help="where layer outputs are written between layers "
                   "(default: beside --out)")
    p.add_argument("--topology", default="memory", choices=["memory", "mmap", "ssd"],
                   help="CSC topology in memory, mapped, or on the SSD (each chunk's lists read through the "
                        "storage engine)")
    p.add_argument("--verify", default="stamp", choices=["stamp", "full", "size"])
    _threads_arg(p)
    _common(p)


def _advise_args(sub) -> None:
    p = sub.add_parser("advise", help="predict epoch time and recommend hardware by throughput per cost (TPC)")
    _training_args(p)
    p.add_argument("--prices", help="price table (TOML; default: the one shipped in terastack/plan/prices.toml)")
    p.add_argument("--ssds", default="1,2,4", help="SSD counts to consider, e.g. 1,2,4")
    p.add_argument("--memory", default=None, help="host memory sizes to consider in GiB (default: the table's)")
    p.add_argument("--gpus", default=None, help="GPU names to consider (default: every one in the table)")
    p.add_argument("--probe", default=None, help="probe JSON of this machine (default: cached, else measured)")
    p.add_argument("--no-calibrate", action="store_true", help="skip the timed training steps (FLOP estimate)")
    p.add_argument("--calibration-steps", type=int, default=5, help="timed training steps on sampled batches")
    _threads_arg(p)
    p.add_argument("--json", action="store_true")


def _threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=-1, help="torch intra-op threads on the CPU (-1: one less than "
                   "the cores, leaving one for sampling and gathering; 0: torch's default)")


def _set_threads(threads: int) -> None:
    if threads < -1:
        raise ValueError(f"threads: must be -1 (auto), 0 (torch default) or a count, got {threads}")
    if threads:
        import torch

        from terastack.gnn.training.train import training_threads

        torch.set_num_threads(training_threads() if threads == -1 else threads)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def fanouts_option(p: argparse.ArgumentParser, default: str | None = "15,10") -> None:
    """``--fanouts``, read the same way wherever it is taken (terastack.gnn.sampling.fanouts), ``-1,5`` included."""
    from terastack.gnn.sampling.fanouts import accept_negative_lists, fanouts_argument

    accept_negative_lists(p)
    p.add_argument("--fanouts", default=default, type=fanouts_argument,
                   help="neighbours sampled per hop, e.g. 15,10 (-1: every neighbour); heterogeneous: one list for "
                        "every relation, or per relation, e.g. 'cites=15,10;writes=10,5;*=5,5' (0: none from that "
                        "relation at that hop)")


def _training_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="dataset directory")
    p.add_argument("--model", default="sage", choices=["sage", "gcn", "gat", "rgcn"],
                   help="sage, gcn, gat (homogeneous); sage (to_hetero(GraphSAGE)) or rgcn (heterogeneous)")
    p.add_argument("--hidden", type=int, default=128)
    fanouts_option(p)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--device-cache", default="0", help="device-tier cache budget (e.g. 4GiB)")
    p.add_argument("--host-cache", default="256MiB", help="host-tier cache budget (e.g. 32GiB)")


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

    return _build(GraphGenerator, args, nodes=args.nodes, avg_degree=args.avg_degree, feat_dim=args.feat_dim,
                  classes=args.classes, dtype=args.dtype, seed=args.seed, train_fraction=args.train_fraction,
                  val_fraction=args.val_fraction, test_fraction=args.test_fraction, signal=args.signal,
                  noise=args.noise)


def _build(builder, args, **fields) -> int:
    """Run a dataset builder (the generator or the importer) with the flags both take, and report the result."""
    cfg = builder.Config(out=args.out, memory_budget=args.memory_budget, force=args.force, progress=not args.quiet,
                         **fields)
    result = builder(cfg).run()
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
    from terastack.gnn.importer import GraphImporter

    if args.source:
        from terastack.gnn.formats.detect import DirectoryImporter

        return _build(DirectoryImporter, args, source=args.source, split=args.split, label_set=args.label_set,
                      split_seed=args.split_seed, undirected=args.undirected, dtype=args.dtype, classes=args.classes)
    return _build(GraphImporter, args, ogb_dir=args.ogb_dir, edge_index=args.edge_index, indptr=args.indptr,
                  indices=args.indices, features=args.features, labels=args.labels, train_idx=args.train_idx,
                  val_idx=args.val_idx, test_idx=args.test_idx, undirected=bool(args.undirected), dtype=args.dtype,
                  classes=args.classes)


def _verify(args) -> int:
    from terastack.gnn.storage.dataset import open_dataset
    from terastack.gnn.storage.hetero_dataset import is_hetero_dataset, open_hetero_dataset

    if is_hetero_dataset(args.data):
        hd = open_hetero_dataset(args.data, verify="full")
        result = {"data": str(hd.root), "target": hd.target, "nodes": hd.num_nodes, "feat_dim": hd.feat_dim,
                  "edges": {"___".join(et): n for et, n in hd.num_edges.items()}, "classes": hd.num_classes,
                  "splits": {k: len(v) for k, v in hd.splits.items()}, "verified": hd.verified}
        hd.close()
        _emit(result, args.json, [f"ok: {hd!r}", f"  splits {result['splits']}, {hd.verified}"])
        return 0
    ds = open_dataset(args.data, verify="full")
    result = {"data": str(ds.root), "nodes": ds.num_nodes, "edges": ds.num_edges, "feat_dim": ds.feat_dim,
              "feat_dtype": ds.feat_dtype.name, "classes": ds.num_classes, "feature_bytes": ds.feature_bytes,
              "splits": {k: len(v) for k, v in ds.splits.items()}, "verified": ds.verified}
    _emit(result, args.json, [f"ok: {ds!r}", f"  features {format_bytes(ds.feature_bytes)}, "
                              f"splits {result['splits']}, {ds.verified}"])
    return 0


def _train(args) -> int:
    from terastack import trace
    from terastack.gnn.training.multi_process import run_training
    from terastack.gnn.training.train import GnnTrainer

    cfg = GnnTrainer.Config(data=args.data, model=args.model, hidden=args.hidden, fanouts=args.fanouts,
                            batch_size=args.batch_size, epochs=args.epochs, lr=args.lr,
                            device_cache=args.device_cache, host_cache=args.host_cache, seed=args.seed,
                            replace=args.replace, overlap=not args.sync, depth=args.depth, samplers=args.samplers,
                            eval_nodes=args.eval_nodes, save_model=args.save_model, verify=args.verify,
                            topology=args.topology, indptr=args.indptr, device=args.device,
                            progress=not args.quiet, check_sync=args.check_sync)
    _set_threads(args.threads)
    if args.trace:
        trace.tracer.start()
    try:
        result = run_training(cfg, nproc=args.nproc)
    finally:
        if args.trace:
            trace.tracer.stop()
            path = trace.tracer.save(args.trace)
            print(f"trace written to {path}", file=sys.stderr)
    if result is None:  # a rank other than 0 of an outer torchrun: rank 0 reports
        return 0
    lines = _hetero_lines(result) if "target" in result["dataset"] else _homogeneous_lines(result)
    lines += _rank_lines(result)
    if result["checkpoint"]:
        lines.append(f"model saved to {result['checkpoint']}")
    _emit(result, args.json, lines)
    return 0


def _homogeneous_lines(result: dict) -> list[str]:
    c = result["cache"]
    lines = [f"dataset {result['dataset']['root']}: {result['dataset']['nodes']} nodes, "
             f"features {format_bytes(result['dataset']['feature_bytes'])} ({result['dataset']['verified']})",
             f"cache: {c['device_rows']} rows in the device tier ({c['device']}), {c['host_rows']} in host, "
             f"{c['cached_fraction']:.1%} of nodes; reads {c['io']}"]
    t = result["topology"]
    if t["topology"] == "ssd":
        lines.append(f"topology on the SSD (indptr in {t['indptr']}): {t['cached_lists']} hot lists cached "
                     f"({format_bytes(t['split']['topology_bytes'])} of the host budget)")
    for e in result["epochs"]:
        lines.append(f"epoch {e['epoch']}: {e['seconds']:.2f} s, {e['batches_per_s']:.1f} batches/s, "
                     f"loss {e['loss_mean']:.4f}, hits device {e['device_hit_rate']:.1%} host {e['host_hit_rate']:.1%} "
                     f"miss {e['miss_rate']:.1%}, SSD {e['ssd_GBps']:.3f} GB/s, "
                     f"topology hits {e['topology_hit_rate']:.1%}{_accuracies(e)}")
    if not result["epochs"] and (result["val_acc"] is not None or result["test_acc"] is not None):
        lines.append(f"untrained model:{_accuracies(result)}")
    return lines


def _hetero_lines(result: dict) -> list[str]:
    d, split = result["dataset"], result["topology"]["split"]
    lines = [f"dataset {d['root']}: target {d['target']}, nodes {d['nodes']}, {len(d['edges'])} relations "
             f"({d['verified']})",
             "cache: rows " + ", ".join(f"{t} {format_bytes(b)}" for t, b in split["feature_bytes"].items())
             + "; lists " + format_bytes(sum(split["list_bytes"].values())) + f" (topology {result['topology']['topology']})"]
    for e in result["epochs"]:
        lines.append(f"epoch {e['epoch']}: {e['seconds']:.2f} s, loss {e['loss_mean']:.4f}, feature misses "
                     f"{e['miss_rate']:.1%}, topology hits {e['topology_hit_rate']:.1%}"
                     + "".join(f", {k} acc {e[k + '_acc']:.4f}" for k in ("train", "val", "test")
                               if e[k + "_acc"] is not None))
    return lines


def _rank_lines(result: dict) -> list[str]:
    r = result.get("ranks", {})
    if r.get("world_size", 1) < 2:
        return []
    synced = f"; parameters compared after {r['steps_checked']} steps, largest difference {r['max_param_diff']:g}" \
        if "steps_checked" in r else ""
    return [f"{r['world_size']} ranks (DistributedDataParallel), each on its share of every batch{synced}"]


def _accuracies(r: dict) -> str:
    return "".join(f", {name} acc {r[key]:.4f}" for name, key in (("val", "val_acc"), ("test", "test_acc"))
                   if r.get(key) is not None)


def _infer(args) -> int:
    from terastack.gnn.training.infer import GnnInference

    cfg = GnnInference.Config(data=args.data, checkpoint=args.checkpoint, out=args.out, embeddings=args.embeddings,
                              chunk_nodes=args.chunk_nodes, device_cache=args.device_cache,
                              host_cache=args.host_cache, work_dir=args.work_dir, topology=args.topology,
                              verify=args.verify, progress=not args.quiet)
    _set_threads(args.threads)
    result = GnnInference(cfg).run()
    d = result["dataset"]
    if "target" in d:
        lines = [f"{d['nodes'][d['target']]} {d['target']} nodes in {result['seconds']:.2f} s; input rows from the "
                 f"cache {1 - result['input_reads']['miss_rate']:.1%}"]
    else:
        per_layer = ", ".join(f"{la['seconds']:.2f} s" for la in result["layers"])
        lines = [f"{d['nodes']} nodes, {len(result['layers'])} layers in {result['seconds']:.2f} s "
                 f"({per_layer}); input rows from the cache {1 - result['input_reads']['miss_rate']:.1%}"]
    lines += [f"{name} written to {result[name]}" for name in ("out", "embeddings") if result[name]]
    if result["out"]:
        lines.append(f"full-neighbourhood accuracy:{_accuracies(result)[1:]}")
    _emit(result, args.json, lines)
    return 0


def _advise(args) -> int:
    from terastack.gnn.advise import feature_file_hardware, probe_feature_file, workload
    from terastack.io import get_engine
    from terastack.gnn.storage.dataset import open_dataset
    from terastack.gnn.storage.hotness import presample
    from terastack.gnn.sampling.fanouts import parse_fanouts
    from terastack.gnn.sampling.sampler import NeighborSampler
    from terastack.plan.hardware import Hardware
    from terastack.plan.tpc import PriceTable, advise, predict_epoch
    from terastack.units import parse_bytes

    fanouts = parse_fanouts(args.fanouts)
    _set_threads(args.threads)  # calibrate the step as `gnn train` will run it
    try:
        ssds = [int(s) for s in args.ssds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"ssds: expected comma-separated counts such as 1,2,4; got {args.ssds!r}") from None
    memory = [float(m) for m in args.memory.split(",")] if args.memory else None
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else None
    prices = PriceTable.load(args.prices)
    ds = open_dataset(args.data)
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=fanouts)
    if len(ds.splits["train"]) == 0:
        raise ValueError(f"{ds.paths['train_idx']}: the training split is empty")
    hot = presample(sampler, ds.splits["train"], args.batch_size, epochs=2)
    ssd = probe_feature_file(ds)  # this SSD, this file, this file system: IOPS, bandwidth, kernel CPU per read
    wl = workload(ds, hot, batch_size=args.batch_size, model=args.model, hidden=args.hidden, layers=len(fanouts),
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
    here = predict_epoch(wl, here_hw, device_cache=parse_bytes(args.device_cache, field="device_cache"),
                         host_cache=parse_bytes(args.host_cache, field="host_cache"),
                         gpu_efficiency=prices.gpu_efficiency, train_threads=wl.compute_threads,
                         queue_depth=get_engine().config.queue_depth)  # the depth the gather will read at
    result = advise(wl, probe, prices, ssd_counts=ssds, memory_gib=memory, gpus=gpus)
    result["this_machine"] = {"hardware": here_hw.name, "measured": probe.measured, **here.to_dict()}
    result["workload"] = {"batches_per_epoch": wl.batches_per_epoch, "nodes_per_batch": wl.nodes_per_batch,
                          "sample_seconds": wl.sample_seconds, "compute_seconds": wl.compute_seconds,
                          "flops_per_batch": wl.flops_per_batch, "feature_bytes": wl.feature_bytes}
    lines = [f"{here_hw.name}, cache {args.device_cache} device + {args.host_cache} host: "
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
