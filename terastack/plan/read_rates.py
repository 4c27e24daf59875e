"""The SSD's random-read rate at a request size: the figure the TPC model prices feature gathering with.

[Note: random reads at the gather's own request size]
An out-of-core GNN epoch reads feature rows at random, one block-aligned extent per missed row (its covering
4 KiB blocks, terastack.gnn.storage.rows [Note: row reads are block reads]), a whole batch's extents in one
``pread_many`` that the storage engine keeps ``queue_depth`` requests of in flight, and writes nothing while it
does (the unified cache is static: filled before the epoch, never spilled). The model used to price those reads
at ``min(sequential read rate, 4 KiB IOPS x 4 KiB)``: figures measured apart from that pattern (a sequential
stream; single blocks), so an extent of several blocks was priced as that many separate 4 KiB reads, and a disk
whose random rate moved from the day's sequential one had nothing to show it. ``terastack probe`` now measures
random reads at a few request sizes through the same engine (``Hardware.ssd_random_reads``: per SSD, reads
only, each entry ``{"request_bytes", "queue_depth", "reads_per_s"}``), and the model takes the rate at the
gather's mean extent (``blocks_per_miss x BLOCK``), interpolating the time per read linearly between measured
sizes (a read costs a fixed latency plus its bytes at the transfer rate) and never above the sequential read
rate. Only entries measured at the queue depth the gather runs at count. Without one (an older cached probe, a
described machine) the old pricing stands, and :class:`ReadRate` says which figure priced the reads, so the
plan's output names its source.

With one measured size (a benchmark's reads of the feature file at the gather's extent), a larger request keeps
that figure's bytes per second and a smaller one (the sampler's one-block list reads, beside wide rows) its time
per read: neither guesses a latency the disk was not seen to have.

The figure is measured before the run, by the probe or on the dataset's own file beside the training steps
(terastack.gnn.advise), not taken from the run's first epoch: ``bench gnn`` checks the model against that very
epoch, and a rate read off it would fit the model to what it predicts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from terastack.constants import BLOCK
from terastack.plan.hardware import Hardware


@dataclass(frozen=True, slots=True)
class ReadRate:
    """Bytes per second over all SSDs for random reads of ``request_bytes``, and where that figure comes from."""

    bytes_per_s: float
    request_bytes: float
    #: "random reads at the request size" (measured at the gather's pattern) or "sequential / 4 KiB IOPS"
    source: str
    measured_at_request_size: bool

    def to_dict(self) -> dict:
        return {"bytes_per_s": self.bytes_per_s, "request_bytes": self.request_bytes, "source": self.source,
                "measured_at_request_size": self.measured_at_request_size}


def random_read_rate(hw: Hardware, request_bytes: float, *, queue_depth: int | None = None) -> ReadRate:
    """The rate ``hw``'s SSDs give random reads of ``request_bytes`` (block-aligned extents) at ``queue_depth``
    (None: whatever depth the figures were measured at); see [Note: random reads at the gather's own request
    size]. Raises ValueError when ``hw`` has no read figure at all."""
    if request_bytes <= 0:
        raise ValueError(f"request_bytes: must be > 0, got {request_bytes}")
    entries = [e for e in hw.ssd_random_reads if queue_depth is None or int(e["queue_depth"]) == queue_depth]
    if entries:
        sizes = np.array([float(e["request_bytes"]) for e in entries])
        per_read = np.array([1.0 / float(e["reads_per_s"]) for e in entries])
        order = np.argsort(sizes)
        sizes, per_read = sizes[order], per_read[order]
        inside = bool(sizes[0] <= request_bytes <= sizes[-1])
        if request_bytes > sizes[-1] and len(sizes) > 1:  # past the largest: the last segment's slope goes on
            slope = (per_read[-1] - per_read[-2]) / (sizes[-1] - sizes[-2])
            seconds = per_read[-1] + slope * (request_bytes - sizes[-1])
        elif request_bytes > sizes[-1]:  # one size measured: its bytes per second, never a guessed latency
            seconds = per_read[-1] * request_bytes / sizes[-1]
        else:
            seconds = float(np.interp(request_bytes, sizes, per_read))
        rate = request_bytes / seconds * hw.ssds
        if hw.ssd_read_total > 0:
            rate = min(rate, hw.ssd_read_total)
        depth = int(entries[0]["queue_depth"])
        how = "measured at" if inside else "extrapolated from"
        return ReadRate(bytes_per_s=float(rate), request_bytes=float(request_bytes), measured_at_request_size=inside,
                        source=f"random reads of {request_bytes / 1024:.1f} KiB at queue depth {depth} "
                               f"({hw.name}; {how} {_sizes(sizes)})")
    rates = [r for r in (hw.ssd_read_total, hw.ssd_rand4k_iops * hw.ssds * BLOCK) if r > 0]
    if not rates:
        raise ValueError(f"hardware {hw.name!r}: SSD read bandwidth and IOPS are unknown (run `terastack probe`)")
    why = (f"no random-read figure at queue depth {queue_depth}" if hw.ssd_random_reads
           else "no random-read figure per request size (an older probe or a described machine)")
    return ReadRate(bytes_per_s=float(min(rates)), request_bytes=float(request_bytes), measured_at_request_size=False,
                    source=f"min(sequential read, 4 KiB IOPS x 4 KiB) of {hw.name}: {why}")


def _sizes(sizes) -> str:
    return ", ".join(f"{s / 1024:g}" for s in sizes) + " KiB"
