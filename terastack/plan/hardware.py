"""What the planners know about a machine: measured by ``terastack probe`` or described by hand.

A :class:`Hardware` with ``measured=False`` is hypothetical (a preset or a
user's description); every prediction made from it is labelled a prediction.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from terastack.units import parse_bytes

GB = 1e9
#: what each entry of ``Hardware.ssd_random_reads`` holds
RANDOM_READ_KEYS = ("request_bytes", "queue_depth", "reads_per_s")


@dataclass(kw_only=True, slots=True)
class Hardware:
    name: str = "this machine"
    measured: bool = False
    cores: int = 1
    host_memory_bytes: int = 0
    #: dense fp32 matmul rate of the CPU
    cpu_flops: float = 0.0
    memcpy_bytes_per_s: float = 0.0
    #: per SSD; multiply by ``ssds`` for the aggregate
    ssd_read_bytes_per_s: float = 0.0
    ssd_write_bytes_per_s: float = 0.0
    ssd_rand4k_iops: float = 0.0
    #: per SSD, with a reader and a writer running at once (writes paced to a training step's mix): what the
    #: disk gives each while it serves both; 0: not measured (reads and writes then take turns: [Note: reads and
    #: writes at once])
    ssd_mixed_read_bytes_per_s: float = 0.0
    ssd_mixed_write_bytes_per_s: float = 0.0
    #: per SSD, random reads only at a few request sizes through the storage engine: entries {"request_bytes",
    #: "queue_depth", "reads_per_s"}; empty: not measured (an older probe, a described machine). The TPC model
    #: reads it at the gather's own request size (terastack.plan.read_rates [Note: random reads at the gather's
    #: own request size])
    ssd_random_reads: list = dataclasses.field(default_factory=list)
    ssds: int = 1
    #: bytes the store may take on the disk(s): the free space the probe saw, or a described machine's; 0 unknown
    disk_bytes: int = 0
    #: AdamW update rate on the CPU (parameters per second)
    cpu_adam_params_per_s: float = 0.0
    #: per optimizer format other than AdamW (``adamw8bit``, ``adafactor``): its update rate on the CPU as a step
    #: updates (the format's own update over optimizer chunks: [Note: a format's rate as the step updates] in
    #: terastack.probe), parameters per second; a format absent is priced at AdamW's
    cpu_update_params_per_s: dict = dataclasses.field(default_factory=dict)
    #: fraction of the CPU's compute rate lost per GB/s of SSD traffic running beside it (DMA and interrupts
    #: share the memory system and the cores); 0: not measured
    cpu_io_slowdown_per_gbps: float = 0.0
    gpu_name: str | None = None
    gpu_memory_bytes: int = 0
    #: dense matmul rate of the accelerator in the training dtype (0: no accelerator)
    gpu_flops: float = 0.0
    #: host<->device copy bandwidth, each direction
    pcie_bytes_per_s: float = 0.0
    nic_bytes_per_s: float = 0.0
    #: the directory the probe measured; several (one per SSD) comma-separated
    probe_dir: str | None = None
    #: per measured directory: {"dir", "device", "ssd_read_bytes_per_s", "ssd_write_bytes_per_s",
    #: "ssd_rand4k_iops", and from newer probes "ssd_mixed_*" and "ssd_random_reads"}; the ssd_* figures above are
    #: their aggregate (:func:`aggregate_ssd`)
    ssd_dirs: list = dataclasses.field(default_factory=list)
    probed_at: str | None = None
    versions: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in ("cores", "ssds"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: must be >= 1, got {getattr(self, f)}")
        for f in ("cpu_flops", "memcpy_bytes_per_s", "ssd_read_bytes_per_s", "ssd_write_bytes_per_s",
                  "ssd_rand4k_iops", "ssd_mixed_read_bytes_per_s", "ssd_mixed_write_bytes_per_s", "disk_bytes",
                  "cpu_adam_params_per_s", "gpu_flops", "pcie_bytes_per_s", "nic_bytes_per_s",
                  "cpu_io_slowdown_per_gbps"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f}: must be >= 0, got {getattr(self, f)}")
        for name, rate in self.cpu_update_params_per_s.items():
            if float(rate) < 0:
                raise ValueError(f"cpu_update_params_per_s: {name} must be >= 0, got {rate}")
        for e in self.ssd_random_reads:
            if not isinstance(e, dict) or any(float(e.get(k, 0)) <= 0 for k in RANDOM_READ_KEYS):
                raise ValueError(f"ssd_random_reads: every entry needs {', '.join(RANDOM_READ_KEYS)} > 0, got {e!r}")

    @property
    def has_gpu(self) -> bool:
        return self.gpu_flops > 0

    @property
    def compute_flops(self) -> float:
        """The rate at which training math runs: the accelerator if there is one, else the CPU."""
        return self.gpu_flops if self.has_gpu else self.cpu_flops

    @property
    def ssd_read_total(self) -> float:
        return self.ssd_read_bytes_per_s * self.ssds

    @property
    def ssd_write_total(self) -> float:
        return self.ssd_write_bytes_per_s * self.ssds

    def ssd_seconds(self, read: float, write: float) -> float:
        """Seconds the SSDs take to read ``read`` and write ``write`` bytes issued together.

        [Note: reads and writes at once]
        A step issues its reads (weights, state) and its writes (updated state) at once, and an NVMe drive
        serves both at once: on the 2-core bench machine a 1.1B step read at fio's full read rate while writing
        at 0.66 GB/s, so pricing the reads at the read rate plus the writes at the write rate (as if they took
        turns) predicted the step 42% slow. The probe measures the rates each gets while both run
        (``ssd_mixed_*``); both streams then go at those rates until the shorter is done, and the rest of the
        longer at its own rate alone. Without a mixed measurement (a preset, an old probe) the two take turns:
        the sum, which is never optimistic."""
        r, w = self.ssd_read_total or 1e9, self.ssd_write_total or 1e9
        rm, wm = self.ssd_mixed_read_bytes_per_s * self.ssds, self.ssd_mixed_write_bytes_per_s * self.ssds
        if rm <= 0 or wm <= 0 or read <= 0 or write <= 0:
            return read / r + write / w
        together = min(read / rm, write / wm)
        return together + (read - rm * together) / r + (write - wm * together) / w

    def dir_bandwidths(self, dirs) -> tuple[float, ...]:
        """The measured read bandwidth of each of ``dirs`` (the store's placement weights), or () when the
        probe did not measure every one of them."""
        measured = {os.path.realpath(e["dir"]): float(e["ssd_read_bytes_per_s"]) for e in self.ssd_dirs}
        weights = tuple(measured.get(os.path.realpath(d), 0.0) for d in dirs)
        return weights if weights and all(w > 0 for w in weights) else ()

    def update_rate(self, optimizer: str) -> float:
        """Parameters per second the CPU updates with ``optimizer``'s format (AdamW's rate where not measured)."""
        return float(self.cpu_update_params_per_s.get(optimizer) or self.cpu_adam_params_per_s)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Hardware":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown hardware fields: {', '.join(sorted(unknown))}")
        return cls(**data)

    def with_overrides(self, **changes) -> "Hardware":
        """A hypothetical variant of this hardware (``measured`` becomes False)."""
        if "host_memory_bytes" in changes:
            changes["host_memory_bytes"] = parse_bytes(changes["host_memory_bytes"], field="host_memory_bytes")
        if "gpu_memory_bytes" in changes:
            changes["gpu_memory_bytes"] = parse_bytes(changes["gpu_memory_bytes"], field="gpu_memory_bytes")
        data = self.to_dict() | changes
        data["measured"] = False
        return Hardware.from_dict(data)


def aggregate_ssd(entries: list[dict]) -> dict:
    """The machine's SSD figures from per-directory measurements: ``ssds`` is the number of distinct devices
    and the per-SSD rates their mean, so ``ssd_read_total`` (and write, and IOPS times ``ssds``) is the *sum*
    over the devices; one directory gives exactly its own figures. Directories on one file system (same
    ``device``) share one SSD: they count once, with the mean of their measurements."""
    if not entries:
        raise ValueError("aggregate_ssd: no directory measured")
    by_device: dict = {}
    for e in entries:
        by_device.setdefault(e.get("device", e["dir"]), []).append(e)
    keys = ("ssd_read_bytes_per_s", "ssd_write_bytes_per_s", "ssd_rand4k_iops")
    mixed = ("ssd_mixed_read_bytes_per_s", "ssd_mixed_write_bytes_per_s")
    if all(k in e for e in entries for k in mixed):
        keys += mixed
    devices = [{k: sum(e[k] for e in group) / len(group) for k in keys} for group in by_device.values()]
    out = {k: sum(d[k] for d in devices) / len(devices) for k in keys}
    out["ssds"] = len(devices)
    random_reads = _mean_random_reads(entries)
    if random_reads:
        out["ssd_random_reads"] = random_reads
    return out


def _mean_random_reads(entries: list[dict]) -> list[dict]:
    """The per-SSD random-read figures over directories: for each (request size, queue depth) every directory
    measured, the mean of their reads per second."""
    keyed: dict = {}
    for e in entries:
        for r in e.get("ssd_random_reads", []):
            keyed.setdefault((int(r["request_bytes"]), int(r["queue_depth"])), []).append(float(r["reads_per_s"]))
    return [{"request_bytes": size, "queue_depth": depth, "reads_per_s": sum(v) / len(v)}
            for (size, depth), v in sorted(keyed.items()) if len(v) == len(entries)]


#: Hypothetical machines for paper-scale questions. Figures are vendor/spec-sheet class numbers; no mixed
#: read+write rates (spec sheets give none), so their reads and writes are priced as taking turns.
PRESETS: dict[str, Hardware] = {
    "rtx4090-workstation": Hardware(
        name="RTX 4090 (24 GB) + 256 GB DDR4 + 2 x 2 TB PCIe4 NVMe SSDs", cores=32, host_memory_bytes=256 * 2**30,
        disk_bytes=4 * 10**12,
        cpu_flops=2.0e12, memcpy_bytes_per_s=40 * GB, ssd_read_bytes_per_s=6.8 * GB,
        ssd_write_bytes_per_s=4.5 * GB, ssd_rand4k_iops=800_000, ssds=2, cpu_adam_params_per_s=2.5e9,
        gpu_name="RTX 4090", gpu_memory_bytes=24 * 2**30, gpu_flops=165e12, pcie_bytes_per_s=25 * GB),
    "a100-server": Hardware(
        name="A100 80 GB + 1 TB DDR4 + 4 x 3.84 TB NVMe SSDs", cores=64, host_memory_bytes=1024 * 2**30,
        disk_bytes=4 * 3_840 * 10**9,
        cpu_flops=3.0e12, memcpy_bytes_per_s=80 * GB, ssd_read_bytes_per_s=6.8 * GB,
        ssd_write_bytes_per_s=4.5 * GB, ssd_rand4k_iops=800_000, ssds=4, cpu_adam_params_per_s=4e9,
        gpu_name="A100-80GB", gpu_memory_bytes=80 * 2**30, gpu_flops=312e12, pcie_bytes_per_s=25 * GB,
        nic_bytes_per_s=12.5 * GB),
    "h200": Hardware(
        name="H200 141 GB + 2 TB DDR5 + 8 x 3.84 TB NVMe SSDs", cores=96, host_memory_bytes=2048 * 2**30,
        disk_bytes=8 * 3_840 * 10**9,
        cpu_flops=5.0e12, memcpy_bytes_per_s=150 * GB, ssd_read_bytes_per_s=12 * GB,
        ssd_write_bytes_per_s=8 * GB, ssd_rand4k_iops=2_000_000, ssds=8, cpu_adam_params_per_s=8e9,
        gpu_name="H200", gpu_memory_bytes=141 * 10**9, gpu_flops=790e12, pcie_bytes_per_s=50 * GB,
        nic_bytes_per_s=50 * GB),
}


def probe_cache_path() -> Path:
    base = os.environ.get("TERASTACK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "terastack")
    return Path(base) / "probe.json"


def save_probe(hw: Hardware, path: str | os.PathLike | None = None) -> Path:
    from terastack.atomic import atomic_write_json

    path = Path(path) if path else probe_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, hw.to_dict())


def load_probe(path: str | os.PathLike | None = None) -> Hardware | None:
    """The cached probe of this machine, or None if there is none."""
    path = Path(path) if path else probe_cache_path()
    if not path.exists():
        return None
    try:
        return Hardware.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"cached probe {path} is unreadable ({exc}); rerun `terastack probe --refresh`") from None

