"""``terastack gnn train``: out-of-core training of a PyG model over an on-disk dataset of either graph kind.

The steps, in order: one placement call (terastack.gnn.graph_placement [Note: one placement call]), the model of
the dataset's kind, then epochs through the pipeline, each scored on the held-out splits (sampled inference, at
most ``eval_nodes`` nodes of each) and checkpointed as the job asks (terastack.gnn.training.run_state [Note: a GNN
run resumed]), and the model saved if asked (terastack.gnn.training.models [Note: model checkpoints]). The settings
are a :class:`terastack.gnn.settings.GnnJob`.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from terastack import trace
from terastack.gnn.graph_placement import Placement
from terastack.gnn.sampling.pipeline import Pipeline
from terastack.gnn.settings import HETERO_MODELS, MODELS, GnnJob
from terastack.gnn.training.data_parallel import SyncCheck, checked_step, current_ranks, wrap
from terastack.gnn.training.hetero_net import HeteroGNN
from terastack.gnn.training.models import GNN, eval_step, save_model, train_step
from terastack.gnn.training.run_state import ModuleState, OptimizerState, RunProgress
from terastack.progress import Progress

#: the epoch number whose random stream drives evaluation batches (never a training epoch)
EVAL_EPOCH = 1 << 30
#: the splits scored after every epoch
SCORED = ("train", "val", "test")
#: the settings a resumed run must share with the run that saved its checkpoint ([Note: a GNN run resumed])
RESUME_SETTINGS = ("data.path", "model.kind", "model.hidden", "sampling.fanouts", "sampling.batch_size",
                   "sampling.replace", "training.seed", "training.lr", "training.nproc")


def training_threads(requested: int = -1) -> int:
    """Intra-op threads for training on the CPU beside the pipeline: ``requested``, or for -1 one less than the cores.

    The sampling and gathering threads need a core; an OpenMP team that spans every core stalls each time one of
    its threads is descheduled (measured: steps 5-10x slower on a busy 2-core machine)."""
    import os

    return max(1, (os.cpu_count() or 1) - 1) if requested == -1 else requested


def train_epoch(pipeline: Pipeline, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_ids: np.ndarray,
                *, batch_size: int, epoch: int, start: int = 0, limit: int = 0, progress: bool = True,
                label: str = "train", step=train_step, after=None) -> dict:
    """Train one epoch through ``pipeline`` from batch ``start`` (its first ``limit`` batches when ``limit`` > 0):
    time (``marks``: the seconds after each step, from the start), losses, per-tier hit rates and SSD traffic.

    ``step(model, optimizer, batch) -> loss`` trains one batch (the default takes either graph kind's batches);
    ``after(k, loss)``, when given, is called once batch k is trained."""
    source, topology = pipeline.source, pipeline.sampler.topology
    before, topo_before = source.stats.snapshot(), topology.stats.snapshot()
    bar = Progress(-(-len(train_ids) // batch_size) - start, label=f"{label} epoch {epoch}", unit="batches",
                   enabled=progress)
    losses, marks = [], []
    started = time.perf_counter()
    batches = pipeline.epoch(train_ids, batch_size, epoch=epoch, start=start)
    try:
        for k, data in enumerate(batches, start):
            with trace.span(f"train {k}", track="train", cat="gnn", nodes=int(data.num_nodes)):
                losses.append(step(model, optimizer, data))
            marks.append(time.perf_counter() - started)
            if after is not None:
                after(k, losses[-1])
            if progress:
                now = source.stats.snapshot()
                rows = max(now["rows"] - before["rows"], 1)
                bar.update(1, loss=losses[-1], dev_hit=(now["device_hits"] - before["device_hits"]) / rows,
                           host_hit=(now["host_hits"] - before["host_hits"]) / rows,
                           ssd_GBps=(now["ssd_bytes"] - before["ssd_bytes"]) / max(marks[-1], 1e-9) / 1e9)
            if limit and len(losses) >= limit:
                break
    finally:
        batches.close()  # stopped early: the stages stop
    seconds = time.perf_counter() - started
    bar.close()
    return _epoch_figures(pipeline, before, topo_before, epoch=epoch, seconds=seconds, losses=losses, marks=marks)


def _epoch_figures(pipeline: Pipeline, before: dict, topo_before: dict, *, epoch: int, seconds: float, losses: list,
                   marks: list) -> dict:
    after_, topo_after = pipeline.source.stats.snapshot(), pipeline.sampler.topology.stats.snapshot()
    delta = {k: after_[k] - before[k] for k in ("rows", "device_hits", "host_hits", "misses", "ssd_bytes",
                                                "ssd_blocks", "ssd_calls", "batches", "io_wait_seconds")}
    rows = max(delta["rows"], 1)
    topo = {k: topo_after[k] - topo_before[k] for k in ("lookups", "hits", "indptr_calls", "indices_calls",
                                                        "ssd_bytes")}
    st = pipeline.last_stats
    return {
        "epoch": epoch, "seconds": seconds, "batches": len(losses), "marks": marks,
        "batches_per_s": len(losses) / seconds if seconds else 0.0,
        "loss_mean": float(np.mean(losses)) if losses else float("nan"), "losses": losses,
        "device_hit_rate": delta["device_hits"] / rows, "host_hit_rate": delta["host_hits"] / rows,
        "miss_rate": delta["misses"] / rows, "ssd_bytes": delta["ssd_bytes"], "ssd_blocks": delta["ssd_blocks"],
        "ssd_calls_per_batch": delta["ssd_calls"] / max(delta["batches"], 1),
        "ssd_GBps": delta["ssd_bytes"] / seconds / 1e9 if seconds else 0.0,
        "rows_gathered": delta["rows"], "sample_seconds": st.sample_seconds, "gather_seconds": st.gather_seconds,
        "io_wait_seconds": delta["io_wait_seconds"], "stall_seconds": st.stall_seconds,
        "max_batch_rows": st.max_rows, "seeds": st.seeds, "samplers": pipeline.config.samplers,
        # the sampler's topology: lists served from memory, and what was read from the SSD for the rest
        "topology_hit_rate": topo["hits"] / max(topo["lookups"], 1), "topology_ssd_bytes": topo["ssd_bytes"],
        "topology_calls_per_batch": (topo["indptr_calls"] + topo["indices_calls"]) / max(len(losses), 1),
    }


def evaluate(pipeline: Pipeline, model: torch.nn.Module, ids: np.ndarray, *, batch_size: int,
             step=eval_step) -> float:
    """Accuracy on the seed nodes ``ids`` (sampled inference, fixed random stream); ``step(model, batch)``
    returns (correct, total)."""
    correct = total = 0
    for data in pipeline.epoch(ids, batch_size, epoch=EVAL_EPOCH, shuffle=False, shard=False):
        c, t = step(model, data)
        correct, total = correct + c, total + t
    return correct / max(total, 1)


def build_model(job: GnnJob, ds, hops: int) -> torch.nn.Module:
    """The job's model for the dataset ``ds``'s kind: :class:`GNN` over a homogeneous graph, :class:`HeteroGNN`
    over a heterogeneous one."""
    kind, hidden = job.model.kind, job.model.hidden
    allowed = HETERO_MODELS if ds.hetero else MODELS
    if kind not in allowed:
        raise ValueError(f"model: {'heterogeneous' if ds.hetero else 'homogeneous'} graphs train one of "
                         f"{', '.join(allowed)}; got {kind!r}")
    torch.manual_seed(job.training.seed)
    if not ds.hetero:
        return GNN(kind, ds.feat_dim, hidden, ds.num_classes, hops)
    return HeteroGNN(kind, ds.node_types, ds.edge_types, {t: ds.feature_dims[t] or 1 for t in ds.node_types}, hidden,
                     ds.num_classes, hops, ds.target)


def dataset_report(ds) -> dict:
    """What the result and a saved model say about the dataset (its kind's counts)."""
    out = {"root": str(ds.root), "classes": ds.num_classes, "verified": ds.verified}
    if ds.hetero:
        return {**out, "target": ds.target, "nodes": ds.node_counts, "feat_dim": ds.feature_dims,
                "edges": {"___".join(et): n for et, n in ds.edge_counts.items()}}
    return {**out, "nodes": ds.num_nodes, "edges": ds.num_edges, "feat_dim": ds.feat_dim,
            "feat_dtype": ds.feat_dtype.name, "feature_bytes": ds.feature_bytes}


class GnnTrainer:
    """Trains a GNN out of core on a homogeneous (``sage``, ``gcn``, ``gat``) or heterogeneous (``sage`` as
    ``to_hetero(GraphSAGE)``, ``rgcn``) dataset; ``run()`` returns the result dict. ``argv``: the command's words
    after ``terastack`` (for the resume command of an interrupted run)."""

    def __init__(self, job: GnnJob, *, progress: bool = True, engine=None, argv: list[str] | None = None):
        if not job.data.path:
            raise ValueError("data: a dataset directory is required (--data DIR)")
        self.job, self.progress, self.engine, self.argv = job, progress, engine, argv
        self.run_: TrainingRun | None = None

    def placement_config(self, ranks) -> Placement.Config:
        job, s = self.job, self.job.sampling
        return Placement.Config(fanouts=s.fanouts, replace=s.replace, seed=job.training.seed, batch_size=s.batch_size,
                                presample_epochs=s.presample_epochs, device_cache=job.cache.device_cache,
                                host_cache=job.cache.host_cache, device=job.cache.device, verify=job.data.verify,
                                topology=job.data.topology, indptr=job.data.indptr, samplers=s.samplers,
                                depth=s.depth, overlap=s.overlap, rank=ranks.rank, world_size=ranks.world_size)

    def run(self) -> dict:
        """Place the dataset, train (resumed when the job says so), save the model; the result. Ctrl-C raises
        :class:`~terastack.training.interrupt.JobInterrupted` with the line naming the ``--resume`` command."""
        job, ranks = self.job, current_ranks()
        self.run_ = None
        try:
            with Placement(job.data.path, self.placement_config(ranks), engine=self.engine) as placed:
                ds = placed.dataset
                if len(ds.splits["train"]) == 0:
                    raise ValueError(f"{ds.root}: the training split is empty")
                model = build_model(job, ds, placed.sampler.hops).to(placed.pipeline.device)
                self.run_ = TrainingRun(job, placed, model, ranks, progress=self.progress)
                trained = self.run_.train()
                caches = placed.describe()
                report = dataset_report(ds)
        except KeyboardInterrupt:
            raise self.interrupted() from None
        saved = None
        if job.output.save_model and ranks.leader:
            saved = str(save_model(model.cpu(), job.output.save_model, dataset=report, training={
                "fanouts": job.sampling.fanouts, "epochs": job.training.epochs, "lr": job.training.lr,
                "seed": job.training.seed}, **trained["final"]))
        return _result(job, placed, report, trained, caches, saved, ranks)

    def interrupted(self):
        """Where the run stood when Ctrl-C came, as one line (terastack.training.interrupt [Note: an interrupted
        run]): the batch reached, the newest checkpoint and the command that resumes from it."""
        from terastack.training.interrupt import JobInterrupted, interrupted_line, latest_checkpoint

        job, run = self.job, self.run_
        last = latest_checkpoint(job.checkpoint.dir) or latest_checkpoint(job.checkpoint.resume)
        where = "before training started" if run is None else \
            f"at batch {run.state.batch} of epoch {run.state.epoch} ({run.state.trained} batches trained)"
        return JobInterrupted(interrupted_line(step=None, total=None, last=last, argv=self.argv, where=where,
                                               checkpoint_dir=job.checkpoint.dir, command=("gnn", "train")))


class TrainingRun:
    """The epochs of one run over a placed dataset: each trained from the batch the run stands at, scored, and
    checkpointed as the job asks (terastack.gnn.training.run_state [Note: a GNN run resumed])."""

    def __init__(self, job: GnnJob, placed: Placement, model: torch.nn.Module, ranks, *, progress: bool):
        from terastack.training.rng_state import RNGState

        self.job, self.placed, self.ranks, self.progress = job, placed, ranks, progress
        self.net = wrap(model, ranks, placed.pipeline.device)  # data-parallel: terastack.gnn.training.data_parallel
        self.sync = SyncCheck(model) if job.training.check_sync and ranks.active else None
        self.step = checked_step(train_step, self.sync)
        self.model, self.optimizer = model, torch.optim.Adam(model.parameters(), lr=job.training.lr)
        self.state = RunProgress({path: job.get(path) for path in RESUME_SETTINGS})
        self.components = {"model": ModuleState(model), "optimizer": OptimizerState(self.optimizer),
                           "progress": self.state, "rng": RNGState()}
        self.saved_at = None  # batches trained when the newest checkpoint was written

    def train(self) -> dict:
        """Every epoch left; the epochs' results, the final scores and the ranks' check."""
        from terastack.training.checkpoint import open_checkpoint

        job, st = self.job, self.state
        if job.checkpoint.resume:
            open_checkpoint(job.checkpoint.resume).load(self.components)
            self.saved_at = st.trained
        while st.epoch < job.training.epochs:
            self.epoch()
        if job.checkpoint.dir and self.saved_at != st.trained:
            self.save()
        unscored = {f"{k}_acc": None for k in SCORED}
        final = {k: st.epochs[-1][k] for k in unscored} if st.epochs else {**unscored, **self.scores()}
        return {"epochs": st.epochs, "final": final, "sync": self.sync}

    def epoch(self) -> None:
        """The epoch the run stands in, from its next batch; scored; checkpointed every N batches, or at its end."""
        job, st, every = self.job, self.state, self.job.checkpoint.every

        def after(k: int, loss: float) -> None:
            st.batch, st.trained = k + 1, st.trained + 1
            st.losses.append(loss)
            if every and st.trained % every == 0:
                self.save()

        first = st.batch
        result = train_epoch(self.placed.pipeline, self.net, self.optimizer, self.placed.dataset.splits["train"],
                             batch_size=job.sampling.batch_size, epoch=st.epoch, start=first,
                             progress=self.progress and self.ranks.leader, step=self.step, after=after)
        st.epochs.append({**result, "first_batch": first, "losses": list(st.losses), **self.scores()})
        st.epoch, st.batch, st.losses = st.epoch + 1, 0, []
        if job.checkpoint.dir and not every:
            self.save()

    def scores(self) -> dict:
        """Accuracy on the first ``eval_nodes`` nodes of each held-out split (the same ones after every epoch)."""
        n, ds = self.job.training.eval_nodes, self.placed.dataset
        out = {}
        for name in SCORED:
            ids = ds.splits[name] if n < 0 else ds.splits[name][:n]
            out[f"{name}_acc"] = evaluate(self.placed.pipeline, self.model, ids, batch_size=self.job.sampling.batch_size
                                          ) if n and len(ids) else None
        return out

    def save(self) -> None:
        from terastack.training.checkpoint import save_checkpoint

        if self.ranks.leader:  # the ranks' states are identical (terastack.gnn.training.data_parallel)
            save_checkpoint(self.job.checkpoint.dir, self.components, step=self.state.trained)
        self.saved_at = self.state.trained


def _result(job: GnnJob, placed: Placement, report: dict, trained: dict, caches: tuple[dict, dict],
            saved: str | None, ranks) -> dict:
    epochs, final, sync = trained["epochs"], trained["final"], trained["sync"]
    hot = placed.hotness[placed.dataset.target]
    target = caches[0]["types"].get(placed.dataset.target, {})
    cached = target.get("device_rows", 0) + target.get("host_rows", 0)
    return {
        "dataset": report, "config": job.to_dict(everything=True),
        "fanouts": {"___".join(et): list(f) for et, f in placed.sampler.fanouts.items()},
        "presample": {"batches": hot.batches, "nodes_per_batch": {t: h.nodes_per_batch for t, h in placed.hotness.items()},
                      "sample_seconds_per_batch": hot.sample_seconds_per_batch,
                      "expected_hit_rate": hot.hit_rate(cached)},
        "setup_seconds": placed.setup_seconds, "cache": caches[0], "topology": caches[1],
        "epochs": [{k: v for k, v in e.items() if k != "losses"} for e in epochs],
        "loss_curve": [loss for e in epochs for loss in e["losses"]],
        **final,
        "accuracy": final["test_acc"],  # the last epoch's test accuracy (the older name of test_acc)
        **{f"{k}_acc_per_epoch": [e[f"{k}_acc"] for e in epochs] for k in SCORED},
        "epoch_seconds": [e["seconds"] for e in epochs],
        "saved_model": saved, "checkpoint": job.checkpoint.dir, "resumed_from": job.checkpoint.resume,
        "ranks": {"world_size": ranks.world_size, **(sync.to_dict() if sync else {})},
    }
