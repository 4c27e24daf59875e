"""One placement call for every user of a dataset: the trainer, inference, the PyG loader and each benchmark
contender.

[Note: one placement call]
:class:`Placement` opens the dataset (a directory, or one already open: the graph kind is the dataset's), builds
the sampler over its relations, counts each node type's hotness (a pre-sampling pass over the training seeds,
or, for a pass that reads every neighbourhood, the lists each row appears in), divides the host and device
budgets over every featured type's rows and every relation's lists (terastack.gnn.storage.budget_split [Note:
one budget over node types and relations]), fills the caches and starts the pipeline. A baseline asks for
another feature source (``features="memory"`` or ``"mmap"``) and gets the same dataset, sampler and pipeline:
only the source differs. It sits above storage and sampling, which know nothing of each other.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from terastack.gnn.sampling.fanouts import largest_draw, parse_fanout_spec
from terastack.gnn.sampling.hotness import degree_hotness, presample
from terastack.gnn.sampling.pipeline import Pipeline, resolve_samplers
from terastack.gnn.sampling.sampler import NeighborSampler
from terastack.gnn.settings import setting_default
from terastack.gnn.storage.budget_split import share_budget
from terastack.gnn.storage.dataset import GraphDataset, open_dataset
from terastack.gnn.storage.features import SOURCES, build_features
from terastack.units import parse_bytes

RANKINGS = ("presample", "degree")


class Placement:
    """A dataset placed for a run: ``dataset``, ``sampler``, ``hotness`` (per node type), ``split``, ``features``
    and ``pipeline``; see [Note: one placement call]. ``close()`` releases the caches (and the dataset when it
    was opened here)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """A GNN job's settings (terastack.gnn.settings: the same names and defaults), and the placement's own."""

        fanouts: object = setting_default("sampling.fanouts")
        replace: bool = setting_default("sampling.replace")
        seed: int = setting_default("training.seed")
        batch_size: int = setting_default("sampling.batch_size")
        presample_epochs: int = setting_default("sampling.presample_epochs")
        device_cache: int | str = setting_default("cache.device_cache")
        host_cache: int | str = setting_default("cache.host_cache")
        device: str = setting_default("cache.device")
        verify: str = setting_default("data.verify")
        topology: str = setting_default("data.topology")
        indptr: str = setting_default("data.indptr")
        samplers: int = setting_default("sampling.samplers")
        depth: int = setting_default("sampling.depth")
        overlap: bool = setting_default("sampling.overlap")
        #: "presample": rank rows and lists by a pre-sampling pass over the seeds; "degree": rows by the lists
        #: they appear in (every row a full-neighbourhood pass reads), no pass
        rank_by: str = "presample"
        keep_examples: int = 4
        #: False: the per-node counts go once the rows are ranked, before the caches are filled (their memory is
        #: not held beside the caches; ``hotness`` is then empty)
        keep_hotness: bool = True
        #: "cache" (the unified cache), or a baseline's source: "memory", "mmap" (with ``mmap_threads``)
        features: str = "cache"
        mmap_threads: int = 1
        #: data parallelism (terastack.gnn.sampling.pipeline.Pipeline.Config)
        rank: int = 0
        world_size: int = 1

        def __post_init__(self) -> None:
            self.fanouts = parse_fanout_spec(self.fanouts)  # the relations are checked once the dataset is open
            self.device_cache = parse_bytes(self.device_cache, field="device_cache")
            self.host_cache = parse_bytes(self.host_cache, field="host_cache")
            for name, allowed in (("rank_by", RANKINGS), ("features", SOURCES)):  # the rest: where the dataset opens
                if getattr(self, name) not in allowed:
                    raise ValueError(f"{name}: must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
            if self.batch_size < 1 or self.presample_epochs < 1:
                raise ValueError(f"batch_size, presample_epochs: must be >= 1, got {self.batch_size}, "
                                 f"{self.presample_epochs}")
            resolve_samplers(self.samplers, None)  # validates

    def __init__(self, data, config: "Placement.Config | None" = None, *, seeds=None, hotness: dict | None = None,
                 after_split=None, engine=None, **fields):
        """``data``: a dataset directory or an opened :class:`GraphDataset`; ``seeds``: the seeds pre-sampled
        (default: the training split); ``hotness``: counts made before (no pass then); ``after_split(self)``: called
        once the budget is split and the lists are cached, before the rows are (to measure with the lists in
        place)."""
        cfg = self.config = config or Placement.Config(**fields)
        started = time.perf_counter()
        self.owned = not isinstance(data, GraphDataset)
        self.dataset = ds = open_dataset(data, verify=cfg.verify, topology=cfg.topology, indptr=cfg.indptr,
                                         topology_budget=cfg.host_cache, engine=engine) if self.owned else data
        self.features, self.closed = None, False
        try:
            self.sampler = NeighborSampler(dataset=ds, fanouts=cfg.fanouts, replace=cfg.replace, seed=cfg.seed)
            opened = time.perf_counter()
            self.hotness, self.split = {}, None
            if cfg.features == "cache":
                self.hotness = hotness or self._hotness(ds, seeds)
                placed = time.perf_counter()
                self.split = share_budget(ds, self.hotness, {et: largest_draw(f) for et, f in self.sampler.fanouts.items()},
                                          host_budget=cfg.host_cache, device_budget=cfg.device_cache)
                if after_split is not None:
                    after_split(self)
                rankings = {t: self.hotness[t].order() for t in self.split.budgets}
                if not cfg.keep_hotness:
                    self.hotness = {}
                self.features = build_features(ds, rankings=rankings, budgets=self.split.budgets, device=cfg.device,
                                               engine=engine)
                del rankings
            else:
                placed = time.perf_counter()
                self.features = build_features(ds, cfg.features, mmap_budget=cfg.host_cache or None,
                                               mmap_threads=cfg.mmap_threads)
            self.pipeline = Pipeline(self.sampler, self.features, ds.target_labels, overlap=cfg.overlap, depth=cfg.depth,
                                     device=cfg.device, rank=cfg.rank, world_size=cfg.world_size,
                                     samplers=resolve_samplers(cfg.samplers, self.sampler.topology))
        except BaseException:
            self.close()
            raise
        self.setup_seconds = {"open": opened - started, "presample": placed - opened,
                              "cache_fill": time.perf_counter() - placed}

    def _hotness(self, ds: GraphDataset, seeds) -> dict:
        cfg = self.config
        if cfg.rank_by == "degree":
            return degree_hotness(ds.node_counts, ds.topologies)
        seeds = ds.splits["train"] if seeds is None else seeds
        if len(seeds) == 0:
            raise ValueError(f"{ds.root}: the training split{f' of {ds.target!r}' if ds.hetero else ''} is empty")
        return presample(self.sampler, seeds, cfg.batch_size, epochs=cfg.presample_epochs, seed=cfg.seed,
                         keep_examples=cfg.keep_examples)

    @property
    def hot(self):
        """The target type's hotness (the one type's, on a homogeneous graph)."""
        return self.hotness[self.dataset.target]

    def describe(self) -> tuple[dict, dict]:
        """(the feature sources, the topology with the budget's split)."""
        return self.features.describe(), {**self.sampler.topology.describe(),
                                          "split": self.split.info if self.split else {}}

    def close(self) -> None:
        """Release the caches (their statistics stay readable) and the dataset opened here; once."""
        if self.features is not None and not self.closed:
            self.features.close()
        if self.owned and not self.closed:
            self.dataset.close()
        self.closed = True

    def __enter__(self) -> "Placement":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
