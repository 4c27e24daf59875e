"""What differs between training on a homogeneous and on a heterogeneous graph, as two small strategies.

[Note: one training recipe for both graph kinds]
terastack.gnn.training.train.GnnTrainer runs one recipe: open the dataset, build the sampler, pre-sample to count
hotness, share the cache budget and fill the caches, build the pipeline and the model, train epochs and
score them, save the model. A graph kind supplies the steps whose data differ: which dataset class opens
the directory, which sampler, which budget split (one feature file and one topology, or one per node type
and relation), which pipeline, model, train and eval step, which splits are scored, and what the result
says about the dataset. Everything else (the loop, evaluation, data parallelism, checkpoints, the result's
shared fields) is written once in the recipe.
"""
from __future__ import annotations


import numpy as np

from terastack.gnn.storage.cache import UnifiedCache
from terastack.gnn.storage.dataset import open_dataset
from terastack.gnn.sampling.fanouts import parse_fanouts
from terastack.gnn.storage.hetero_dataset import is_hetero_dataset, open_hetero_dataset
from terastack.gnn.sampling.hetero_sampler import HeteroNeighborSampler
from terastack.gnn.sampling.pipeline import HeteroPipeline
from terastack.gnn.storage.hetero_cache import build_features
from terastack.gnn.storage.budget_split import hetero_share_budget, share_budget
from terastack.gnn.storage.hotness import hetero_presample, presample
from terastack.gnn.training.hetero_net import HETERO_MODELS, HeteroGNN
from terastack.gnn.training.models import MODELS, GNN, eval_step, save_model, train_step
from terastack.gnn.sampling.pipeline import Pipeline, resolve_samplers
from terastack.gnn.sampling.sampler import NeighborSampler


class HomogeneousGraph:
    """One node type, one relation: one feature cache (terastack.gnn.storage.cache) and one topology."""

    name = "homogeneous"
    scored = ("val", "test")
    train_step = staticmethod(train_step)
    eval_step = staticmethod(eval_step)

    def __init__(self, cfg, engine=None):
        if cfg.model not in MODELS:
            raise ValueError(f"model: homogeneous graphs train one of {', '.join(MODELS)}; got {cfg.model!r}")
        self.cfg, self.engine = cfg, engine
        self.fanouts = parse_fanouts(cfg.fanouts)
        self.ds = open_dataset(cfg.data, verify=cfg.verify, topology=cfg.topology, indptr=cfg.indptr,
                               topology_budget=cfg.host_cache, engine=engine)
        self.features = None
        self.split: dict = {}

    def make_sampler(self):
        cfg = self.cfg
        self.sampler = NeighborSampler(topology=self.ds.topology, fanouts=self.fanouts, replace=cfg.replace,
                                       seed=cfg.seed)
        return self.sampler

    def train_ids(self) -> np.ndarray:
        ids = self.ds.splits["train"]
        if len(ids) == 0:
            raise ValueError(f"{self.ds.paths['train_idx']}: the training split is empty")
        return ids

    def presample(self, train_ids: np.ndarray):
        cfg = self.cfg
        self.hot = presample(self.sampler, train_ids, cfg.batch_size, epochs=cfg.presample_epochs, seed=cfg.seed)
        return self.hot

    def place(self) -> None:
        """Share the host budget between hot neighbour lists and feature rows, and fill the feature cache."""
        cfg = self.cfg
        self.split, feature_host = share_budget(self.ds, self.hot, cfg.host_cache, self.fanouts)
        self.features = UnifiedCache(self.ds, self.hot.order(), device_budget=cfg.device_cache,
                                     host_budget=feature_host, device=cfg.device, engine=self.engine)

    def pipeline(self, ranks) -> Pipeline:
        cfg = self.cfg
        return Pipeline(self.sampler, self.features, self.ds.labels, overlap=cfg.overlap, depth=cfg.depth,
                        device=cfg.device, rank=ranks.rank, world_size=ranks.world_size,
                        samplers=resolve_samplers(cfg.samplers, self.ds.topology))

    def model(self):
        ds = self.ds
        return GNN(self.cfg.model, ds.feat_dim, self.cfg.hidden, ds.num_classes, len(self.fanouts))

    def describe_caches(self) -> tuple[dict, dict]:
        return self.features.describe(), {**self.ds.topology.describe(), "split": self.split}

    def close(self) -> None:
        if self.features is not None:
            self.features.close()
        self.ds.close()

    def save(self, model, final: dict) -> str:
        cfg, ds = self.cfg, self.ds
        return str(save_model(model, cfg.save_model, dataset={
            "root": str(ds.root), "nodes": ds.num_nodes, "feat_dim": ds.feat_dim, "classes": ds.num_classes},
            training={"fanouts": list(self.fanouts), "epochs": cfg.epochs, "lr": cfg.lr, "seed": cfg.seed},
            val_acc=final["val_acc"], test_acc=final["test_acc"]))

    def report(self, setup: dict) -> dict:
        """The result's fields that describe this kind's dataset, pre-sampling and set-up."""
        ds, hot, cache = self.ds, self.hot, self.features
        return {
            "dataset": {"root": str(ds.root), "nodes": ds.num_nodes, "edges": ds.num_edges, "feat_dim": ds.feat_dim,
                        "feat_dtype": ds.feat_dtype.name, "feature_bytes": ds.feature_bytes,
                        "verified": ds.verified},
            "presample": {"batches": hot.batches, "nodes_per_batch": hot.nodes_per_batch,
                          "sample_seconds_per_batch": hot.sample_seconds_per_batch,
                          "expected_hit_rate": hot.hit_rate(cache.device_rows + cache.host_rows)},
            "setup_seconds": {**setup, "cache_fill": cache.fill_seconds},
        }


class HeterogeneousGraph:
    """Several node types and relations: a cache per featured type, a topology per relation."""

    name = "heterogeneous"
    scored = ("train", "val", "test")
    train_step = staticmethod(train_step)
    eval_step = staticmethod(eval_step)

    def __init__(self, cfg, engine=None):
        if cfg.model not in HETERO_MODELS:
            raise ValueError(f"model: heterogeneous graphs train one of {', '.join(HETERO_MODELS)}; "
                             f"got {cfg.model!r}")
        self.cfg, self.engine = cfg, engine
        self.ds = open_hetero_dataset(cfg.data, verify=cfg.verify, topology=cfg.topology, indptr=cfg.indptr,
                                      topology_budget=cfg.host_cache, engine=engine)
        self.features = None
        self.split: dict = {}

    def make_sampler(self):
        cfg = self.cfg
        self.sampler = HeteroNeighborSampler.for_dataset(self.ds, fanouts=cfg.fanouts, replace=cfg.replace,
                                                         seed=cfg.seed)
        return self.sampler

    def train_ids(self) -> np.ndarray:
        ids = self.ds.splits["train"]
        if len(ids) == 0:
            raise ValueError(f"{self.ds.root}: the training split of {self.ds.target!r} is empty")
        return ids

    def presample(self, train_ids: np.ndarray):
        cfg = self.cfg
        self.hot = hetero_presample(self.sampler, train_ids, cfg.batch_size, epochs=cfg.presample_epochs,
                                    seed=cfg.seed)
        return self.hot

    def place(self) -> None:
        """One budget over every type's rows and every relation's lists (terastack.gnn.storage.budget_split [Note: one
        budget over node types and relations]), then a cache per featured type."""
        cfg = self.cfg
        budgets, self.split = hetero_share_budget(self.ds, self.hot, self.sampler, host_budget=cfg.host_cache,
                                                  device_budget=cfg.device_cache)
        self.features = build_features(self.ds, {t: h.order() for t, h in self.hot.items()}, budgets,
                                       device=cfg.device, engine=self.engine)

    def pipeline(self, ranks) -> Pipeline:
        cfg, ds = self.cfg, self.ds
        return HeteroPipeline(self.sampler, self.features, ds.labels[ds.target], overlap=cfg.overlap,
                              depth=cfg.depth, device=cfg.device, rank=ranks.rank, world_size=ranks.world_size,
                              samplers=resolve_samplers(cfg.samplers, self.sampler.topology))

    def model(self):
        ds = self.ds
        in_dims = {t: ds.feat_dim[t] or 1 for t in ds.node_types}
        return HeteroGNN(self.cfg.model, ds.node_types, ds.edge_types, in_dims, self.cfg.hidden, ds.num_classes,
                         self.sampler.hops, ds.target)

    def describe_caches(self) -> tuple[dict, dict]:
        return self.features.describe(), {**self.sampler.topology.describe(), "split": self.split}

    def close(self) -> None:
        if self.features is not None:
            self.features.close()
        self.ds.close()

    def _fanouts(self) -> dict:
        return {"___".join(et): list(v) for et, v in self.sampler.fanouts.items()}

    def save(self, model, final: dict) -> str:
        cfg, ds = self.cfg, self.ds
        return str(save_model(model.cpu(), cfg.save_model, dataset={
            "root": str(ds.root), "nodes": ds.num_nodes, "classes": ds.num_classes, "target": ds.target},
            training={"fanouts": self._fanouts(), "epochs": cfg.epochs, "lr": cfg.lr, "seed": cfg.seed}, **final))

    def report(self, setup: dict) -> dict:
        ds, hot = self.ds, self.hot
        return {
            "dataset": {"root": str(ds.root), "target": ds.target, "nodes": ds.num_nodes,
                        "edges": {"___".join(et): n for et, n in ds.num_edges.items()},
                        "feat_dim": ds.feat_dim, "verified": ds.verified},
            "fanouts": self._fanouts(),
            "presample": {"batches": hot[ds.target].batches,
                          "nodes_per_batch": {t: h.nodes_per_batch for t, h in hot.items()}},
            "setup_seconds": setup,
        }


def open_graph(cfg, engine=None):
    """The graph kind of ``cfg.data`` with its dataset open."""
    kind = HeterogeneousGraph if is_hetero_dataset(cfg.data) else HomogeneousGraph
    return kind(cfg, engine)
