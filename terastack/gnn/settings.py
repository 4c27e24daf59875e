"""The settings of a GNN job (``terastack gnn train``), one field each in sections of :class:`GnnJob`, read by
terastack's one job machinery (terastack.training.job [Note: a job setting is one field]): the flags, the keys of
a ``--config`` file (YAML or TOML) and the ``key=value`` overrides follow from the fields, and every default is
written once, here. ``terastack gnn infer`` and ``advise`` take the sections they share with training from here
too. :func:`gnn_job` builds a job by the flags' names (``gnn_job(data=DIR, epochs=2)``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from terastack.gnn.sampling.fanouts import parse_fanout_spec
from terastack.gnn.storage.dataset import TOPOLOGY_MODES, VERIFY_MODES
from terastack.gnn.storage.topology import INDPTR_MODES
from terastack.training.job import SettingError, build_job, setting
from terastack.training.job.sections import SectionedJob, flat_index
from terastack.training.job.setting import at_least, one_of, read_fields
from terastack.units import parse_bytes

#: the models of each graph kind (terastack.gnn.training.models, terastack.gnn.training.hetero_net)
MODELS, HETERO_MODELS = ("sage", "gcn", "gat"), ("sage", "rgcn")


def fanouts_text(spec) -> str:
    """Fanouts as one line: ``15,10``, or per relation ``cites=15,10;*=5,5`` (a file's table, or a parsed spec)."""
    if isinstance(spec, dict):
        return ";".join(f"{'___'.join(k) if isinstance(k, tuple) else k}={fanouts_text(v)}" for k, v in spec.items())
    return spec if isinstance(spec, str) else ",".join(str(int(v)) for v in spec)


@dataclass(kw_only=True, slots=True)
class GnnDataSection:
    """the dataset"""
    SECTION = "data"

    path: str | None = setting(None, flat="data", metavar="DIR", path="path", help="dataset directory (terastack "
                               "gnn gen / import), homogeneous or heterogeneous")
    verify: str = setting("stamp", choices=VERIFY_MODES, help="stamp: hash the files unless an unchanged dataset "
                          "was fully checked before; full: always; size: sizes only")
    topology: str = setting("memory", choices=TOPOLOGY_MODES, help="the CSC topology in memory, mapped, or on the "
                            "SSD (read per hop through the storage engine, hot lists cached out of --host-cache)")
    indptr: str = setting("auto", choices=INDPTR_MODES, help="with --topology ssd: indptr in memory (about 2.1 "
                          "bytes a node), on the SSD, or auto (in memory when that is at most a quarter of --host-cache)")

    def __post_init__(self) -> None:
        read_fields(self)
        for name, allowed in (("verify", VERIFY_MODES), ("topology", TOPOLOGY_MODES), ("indptr", INDPTR_MODES)):
            one_of(self, name, allowed)


@dataclass(kw_only=True, slots=True)
class GnnModelSection:
    """the model"""
    SECTION = "model"

    kind: str = setting("sage", flat="model", choices=tuple(dict.fromkeys(MODELS + HETERO_MODELS)),
                        help="sage, gcn, gat (homogeneous); sage (to_hetero(GraphSAGE)) or rgcn (heterogeneous)")
    hidden: int = setting(128, help="hidden width")

    def __post_init__(self) -> None:
        read_fields(self)
        one_of(self, "kind", tuple(dict.fromkeys(MODELS + HETERO_MODELS)))
        at_least(self, "hidden", 1)


@dataclass(kw_only=True, slots=True)
class SamplingSection:
    """neighbour sampling, pre-sampling and the pipeline"""
    SECTION = "sampling"

    fanouts: str | tuple[int, ...] = setting("15,10", help="neighbours sampled per hop (-1: every neighbour); "
                                             "heterogeneous: one list for every relation or per relation, e.g. "
                                             "'cites=15,10;*=5,5' (0: none from that relation at that hop)")
    batch_size: int = setting(1024, help="seed nodes per batch")
    replace: bool = setting(False, help="sample neighbours with replacement")
    presample_epochs: int = setting(2, help="epochs of the pre-sampling pass that places the caches")
    samplers: int = setting(0, help="sampler threads, each sampling every N-th batch (batches stay in order and "
                            "identical); 0: 2 with --topology ssd (a sampler mostly waits for its reads there), else 1")
    depth: int = setting(1, help="batches each pipeline queue holds")
    overlap: bool = setting(True, help="sample, gather and train at once (--no-overlap: one after another)")

    def __post_init__(self) -> None:
        if isinstance(self.fanouts, dict):  # a file's table of per-relation lists
            self.fanouts = fanouts_text(self.fanouts)
        read_fields(self)
        try:  # the text checked here; which relations exist, once the dataset is open
            self.fanouts = fanouts_text(parse_fanout_spec(self.fanouts))
        except ValueError as exc:
            raise SettingError("sampling.fanouts", str(exc).removeprefix("fanouts: ")) from None
        for name in ("batch_size", "presample_epochs", "depth"):
            at_least(self, name, 1)
        at_least(self, "samplers", 0)


@dataclass(kw_only=True, slots=True)
class CacheSection:
    """the unified cache's memory"""
    SECTION = "cache"

    device_cache: str | int = setting(0, metavar="BYTES", help="device-tier cache budget, e.g. 4GiB (without an "
                                      "accelerator: host memory with its own budget)")
    host_cache: str | int = setting("256MiB", metavar="BYTES", help="host-tier budget for feature rows, hot "
                                    "neighbour lists and the lookup tables, e.g. 32GiB")
    device: str = setting("auto", help="auto (CUDA when available), cpu or cuda[:N]")

    def __post_init__(self) -> None:
        read_fields(self)
        for name in ("device_cache", "host_cache"):
            try:
                setattr(self, name, parse_bytes(getattr(self, name), field=f"cache.{name}"))
            except ValueError as exc:
                raise SettingError(f"cache.{name}", str(exc).split(": ", 1)[-1]) from None
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise SettingError("cache.device", f"must be auto, cpu or cuda[:N]; got {self.device!r}")


@dataclass(kw_only=True, slots=True)
class GnnTrainingSection:
    """the optimizer, the epochs and the processes"""
    SECTION = "training"

    epochs: int = setting(1, help="passes over the training seeds")
    lr: float = setting(3e-3, help="Adam's learning rate")
    seed: int = setting(0, help="initialization, batch order and sampling")
    eval_nodes: int = setting(4096, help="nodes of each held-out split scored after every epoch (-1: all, 0: none)")
    nproc: int = setting(1, help="data-parallel ranks on this machine (DDP; gloo on the CPU): each trains on its "
                         "share of every batch's seeds; under an outer torchrun, one rank per process")
    check_sync: bool = setting(False, help="with several ranks: gather every rank's parameters after every step "
                               "and report the largest difference")
    threads: int = setting(-1, help="torch intra-op threads on the CPU (-1: one less than the cores, leaving one "
                           "for sampling and gathering; 0: torch's default)")

    def __post_init__(self) -> None:
        read_fields(self)
        for name, low in (("epochs", 0), ("nproc", 1), ("eval_nodes", -1), ("threads", -1)):
            at_least(self, name, low)
        if not self.lr > 0:
            raise SettingError("training.lr", f"must be > 0, got {self.lr}")


@dataclass(kw_only=True, slots=True)
class GnnCheckpointSection:
    """checkpoints and resuming"""
    SECTION = "checkpoint"

    dir: str | None = setting(None, flat="checkpoint", metavar="DIR", path="path", help="write checkpoints to DIR "
                              "(the model, the optimizer, the epoch and the batch reached)")
    every: int = setting(0, flat="checkpoint_every", metavar="N", help="checkpoint every N batches (default: at "
                         "the end of every epoch when --checkpoint is given)")
    resume: str | None = setting(None, metavar="DIR", path="path", help="continue from the checkpoint in DIR: the "
                                 "same batches in the same order, the same model as a run never stopped")

    def __post_init__(self) -> None:
        read_fields(self)
        at_least(self, "every", 0)


@dataclass(kw_only=True, slots=True)
class GnnOutputSection:
    """the result"""
    SECTION = "output"

    save_model: str = setting("", metavar="PATH", path="path", help="write the trained model's weights to PATH (e.g. "
                              "model.pt) and its description to PATH.json, for `terastack gnn infer`")

    def __post_init__(self) -> None:
        read_fields(self)
        if self.save_model.endswith(".json"):
            raise SettingError("output.save_model", f"{self.save_model} ends in .json, the suffix of a model's "
                               "description file; give the weights another suffix (e.g. .pt)")


@dataclass(kw_only=True, slots=True)
class GnnJob(SectionedJob):
    """A GNN training job: one section per concern, each validated when built (``GnnJob()`` lacks only the
    dataset)."""

    data: GnnDataSection = field(default_factory=GnnDataSection)
    model: GnnModelSection = field(default_factory=GnnModelSection)
    sampling: SamplingSection = field(default_factory=SamplingSection)
    cache: CacheSection = field(default_factory=CacheSection)
    training: GnnTrainingSection = field(default_factory=GnnTrainingSection)
    checkpoint: GnnCheckpointSection = field(default_factory=GnnCheckpointSection)
    output: GnnOutputSection = field(default_factory=GnnOutputSection)


def gnn_job(**flat) -> GnnJob:
    """The job of the settings given by their flat names (the flags' names: ``data``, ``epochs``, ``host_cache``,
    ...), the rest at their defaults."""
    index = flat_index(GnnJob)
    unknown = [k for k in flat if k not in index]
    if unknown:
        raise SettingError(unknown[0], f"not a GNN job setting ({', '.join(index)})")
    return build_job({index[k]: v for k, v in flat.items()}, GnnJob)


def setting_default(path: str):
    """The default of GNN job setting ``section.field`` (for a command that takes it outside a job)."""
    section, name = path.split(".", 1)
    return GnnJob.__dataclass_fields__[section].default_factory.__dataclass_fields__[name].default
