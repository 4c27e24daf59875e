"""The job's sections of one engine each: the knobs only that engine has (``offload``: the offloaded engine,
:mod:`terastack.llm`; ``disdp``: the disaggregated engine, :mod:`terastack.disdp`), and the choices those engines
import from here rather than repeat."""
from __future__ import annotations

from dataclasses import dataclass

from terastack.units import parse_bytes
from terastack.training.job.setting import SettingError, at_least, one_of, read_fields, setting

#: the disaggregated engine's agent modes and server state homes (terastack.disdp.roles / .server)
DISDP_AGENTS = ("thread", "process")
DISDP_STATES = ("memory", "ssd")
DISDP_DEVICES = ("cpu", "cuda")
#: the default bound on a vocabulary slice (terastack.llm.vocab_slices; terastack plan llm takes the same)
DEFAULT_VOCAB_SLICE = "256MiB"
#: when the offloaded engine checks a model family before training ([Note: the family check])
FAMILY_CHECKS = ("auto", "always", "never")


@dataclass(kw_only=True, slots=True)
class OffloadSection:
    """the offloaded engine (terastack finetune): knobs only it has"""
    SECTION = "offload"
    ENGINE = "the offloaded engine (terastack finetune, terastack plan llm)"

    calibrate: bool = setting(True, help="time each distinct layer once on this machine so the plan predicts "
                              "from measured times")
    hardware: str | None = setting(None, metavar="FILE", help="a probe JSON (terastack probe --json) to plan "
                                   "with (default: the cached probe, else quick measurements)", path="path")
    device: str = setting("auto", help="auto, cpu or cuda[:N]")
    prefetch_depth: int = setting(1, metavar="N", help="decoder layers whose weights are fetched ahead")
    inline_updates: bool | None = setting(None, help="eager updates on the training thread, right after each "
                                          "layer's backward (default: when computing on the CPU)")
    state_placement: str = setting("auto", choices=("auto", "ssd"), help="auto: optimizer state rests in host "
                                   "memory while the budget allows; ssd: all of it on the SSD")
    optimizer_impl: str = setting("auto", choices=("auto", "fused", "foreach", "single"),
                                  help="the AdamW kernel (auto: fused where torch supports it)")
    optimizer_chunk: int = setting(1 << 20, metavar="N", help="elements per optimizer chunk: the optimizer reads "
                                   "and writes its state in pieces of this size")
    retain_weights: bool = setting(True, help="keep the updated weights of the first layers in the device tier "
                                   "for the next forward, where they fit")
    timeout: float = setting(600.0, metavar="SECONDS", help="every wait (a transfer, an update) gives up after "
                             "this long, naming what it waited for")
    check_family: str = setting("auto", choices=FAMILY_CHECKS, help="before the first step, compare each streamed "
                                "layer's outputs and gradients with the model's own on a probe batch: auto (model "
                                "families the tests do not verify), always, or never")
    vocab_slice: str | int = setting(DEFAULT_VOCAB_SLICE, metavar="BYTES", help="an embedding or output head whose fp32 "
                                     "weight is larger than this streams in row slices of at most this size, each "
                                     "its own unit (not with adafactor); 0: never")

    def __post_init__(self) -> None:
        read_fields(self)
        try:
            self.vocab_slice = parse_bytes(self.vocab_slice, field="offload.vocab_slice")
        except ValueError as exc:
            raise SettingError("offload.vocab_slice", str(exc).split(": ", 1)[1]) from None
        at_least(self, "prefetch_depth", 0)
        at_least(self, "optimizer_chunk", 1024)
        one_of(self, "state_placement", ("auto", "ssd"))
        one_of(self, "optimizer_impl", ("auto", "fused", "foreach", "single"))
        one_of(self, "check_family", FAMILY_CHECKS)
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise SettingError("offload.device", f"must be auto, cpu or cuda[:N]; got {self.device!r}")
        if not self.timeout > 0:
            raise SettingError("offload.timeout", f"must be > 0 seconds, got {self.timeout}")


@dataclass(kw_only=True, slots=True)
class DisdpSection:
    """the disaggregated engine (terastack dist train): its roles and their processes"""
    SECTION = "disdp"
    ENGINE = "the disaggregated engine (terastack dist train)"

    workers: int = setting(2, flag=False, help="worker ranks (model-sharded data parallel)")
    servers: int = setting(1, flag=False, help="parameter-server shards")
    aggregator: bool = setting(True, flag=False, help="aggregate gradients before the servers")
    agents: str = setting("thread", flag=False, choices=DISDP_AGENTS, help="communication agents per worker: "
                          "threads or processes")
    state: str = setting("memory", flag=False, choices=DISDP_STATES, help="where the servers keep their fp32 "
                         "weights and AdamW moments: memory, or ssd (the tiered store: a few buckets in memory)")
    run_dir: str | None = setting(None, flag=False, path="path", writes=True, help="the job's directory (statistics, "
                                  "the servers' SSD state, traces); default: terastack-dist under the store's first "
                                  "directory (--store), else a temporary directory removed at the end")
    prefetch: int = setting(2, flag=False, help="bucket deliveries an agent may run ahead of its worker's compute")
    reshard: bool = setting(True, flag=False, help="release each layer after its forward and fetch it again for "
                            "its backward")
    timeout_s: float = setting(120.0, flag=False, help="bound on every wait (seconds); a silent peer is reported "
                               "by rank and role")
    threads: int = setting(1, flag=False, help="torch intra-op threads per process")
    helper_nice: int = setting(10, flag=False, help="niceness added to servers, the aggregator and agents")
    kill_at: str = setting("", flag=False, help="fault injection for resilience tests: ROLE:INDEX:STEP[:FAULT]")
    progress: bool = setting(True, flag=False, help="progress lines")
    trace_dir: str = setting("", flag=False, help="write a Chrome trace per rank into this directory")
    device: str = setting("cpu", flat="dist_device", flag=False, choices=DISDP_DEVICES,
                          help="where the ranks' messages travel: cpu (gloo) or cuda (NCCL, each rank on the GPU of "
                          "its LOCAL_RANK)")

    def __post_init__(self) -> None:
        read_fields(self)
        for name in ("workers", "servers", "prefetch", "threads"):
            at_least(self, name, 1)
        one_of(self, "agents", DISDP_AGENTS)
        one_of(self, "state", DISDP_STATES)
        one_of(self, "device", DISDP_DEVICES)
        if not 0 <= self.helper_nice <= 19:
            raise SettingError("disdp.helper_nice", f"must be in [0, 19], got {self.helper_nice}")
        if not self.timeout_s > 0:
            raise SettingError("disdp.timeout_s", f"must be > 0, got {self.timeout_s}")
