"""Out-of-core GEMM: C = A @ B with A and C stored as row tiles in a TieredStore on SSD.

B (K x N) is small and rests in host memory; A (M x K) and C (M x N) are far
larger than the host budget and stream through the store's device tier (host
memory with its own budget on a machine without an accelerator).

[Note: the pipelined schedule]
One loop, three stages per iteration i:
    prefetch A[i+1]   (SSD -> device tier, asynchronous)
    compute  C[i] = A[i] @ B
    write back C[i]   (device tier -> SSD, asynchronous; waited for one
                       iteration later, so at most one C tile is in flight)
Device-tier peak: two A tiles, two C tiles and B, whatever M is. The
synchronous schedule runs the same stages one after another and never has
more than one A tile and one C tile resident.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from terastack import trace
from terastack.constants import padded_size
from terastack.tiers import Tier, TieredStore


def tile_name(matrix: str, i: int) -> str:
    return f"{matrix}/{i}"


@dataclass(frozen=True, slots=True)
class TiledMatrix:
    """A matrix stored as ``tiles`` row tiles of ``tile_rows`` rows (the last may be shorter)."""

    name: str
    rows: int
    cols: int
    tile_rows: int

    @property
    def tiles(self) -> int:
        return -(-self.rows // self.tile_rows)

    def tile_shape(self, i: int) -> tuple[int, int]:
        return (min(self.tile_rows, self.rows - i * self.tile_rows), self.cols)

    def tile(self, i: int) -> str:
        return tile_name(self.name, i)

    def row_range(self, i: int) -> tuple[int, int]:
        start = i * self.tile_rows
        return start, min(self.rows, start + self.tile_rows)


def working_set_bytes(a: TiledMatrix, n: int, itemsize: int = 4) -> int:
    """Device-tier bytes the pipelined schedule needs: 2 A tiles + 2 C tiles + B, each as the store holds it
    (:func:`~terastack.constants.padded_size`)."""
    return (2 * padded_size(a.tile_rows * a.cols * itemsize) + 2 * padded_size(a.tile_rows * n * itemsize)
            + padded_size(a.cols * n * itemsize))


class OutOfCoreGemm:
    """Multiplies a tiled matrix on SSD by a host-resident matrix, tile by tile, through a TieredStore."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        #: overlap I/O with compute (False: read, compute, write, repeat)
        pipelined: bool = True

    def __init__(self, store: TieredStore, config: "OutOfCoreGemm.Config | None" = None):
        self.store = store
        self.config = config or OutOfCoreGemm.Config()

    def multiply(self, a: TiledMatrix, b_name: str, c: TiledMatrix, *, progress=None) -> dict:
        """Compute C = A @ B into ``c``'s tiles (created here, resting on SSD). Returns stage timings."""
        b = self.store.get(b_name, Tier.DEVICE)
        if b.shape != (a.cols, c.cols) or c.rows != a.rows or c.tile_rows != a.tile_rows:
            raise ValueError(f"shapes do not chain: A {a.rows}x{a.cols}, B {tuple(b.shape)}, C {c.rows}x{c.cols}")
        run = self._pipelined if self.config.pipelined else self._synchronous
        stats = {"wait_io_s": 0.0, "compute_s": 0.0}
        start = time.perf_counter()
        run(a, b, c, stats, progress)
        self.store.evict(b_name).result()
        stats["total_s"] = time.perf_counter() - start
        return stats

    def _compute(self, a_tile: torch.Tensor, b: torch.Tensor, c: TiledMatrix, i: int, stats: dict) -> None:
        t0 = time.perf_counter()
        with trace.span(f"compute C/{i}", track="compute"):
            out = self.store.create(c.tile(i), c.tile_shape(i), a_tile.dtype, home=Tier.SSD, tier=Tier.DEVICE)
            torch.matmul(a_tile, b, out=out)
            self.store.mark_dirty(c.tile(i))
        stats["compute_s"] += time.perf_counter() - t0

    def _wait(self, fut, label: str, stats: dict):
        t0 = time.perf_counter()
        with trace.span(f"wait {label}", track="compute"):
            value = fut.result()
        stats["wait_io_s"] += time.perf_counter() - t0
        return value

    def _pipelined(self, a: TiledMatrix, b: torch.Tensor, c: TiledMatrix, stats: dict, progress) -> None:
        # prologue: the first A tile is on its way before the loop starts
        next_a = self.store.prefetch(a.tile(0), Tier.DEVICE)
        pending_c = None
        for i in range(a.tiles):
            # steady state: prefetch i+1, compute i, write back i (waited for at i+1)
            a_tile = self._wait(next_a, f"A/{i}", stats)
            if i + 1 < a.tiles:
                next_a = self.store.prefetch(a.tile(i + 1), Tier.DEVICE)
            self._compute(a_tile, b, c, i, stats)
            self.store.evict(a.tile(i))  # clean: frees the tile at once
            if pending_c is not None:
                self._wait(pending_c, f"C/{i - 1} written", stats)
            pending_c = self.store.evict(c.tile(i))
            if progress:
                progress.update(1)
        # epilogue: the last C tile
        if pending_c is not None:
            self._wait(pending_c, f"C/{a.tiles - 1} written", stats)

    def _synchronous(self, a: TiledMatrix, b: torch.Tensor, c: TiledMatrix, stats: dict, progress) -> None:
        for i in range(a.tiles):
            a_tile = self._wait(self.store.prefetch(a.tile(i), Tier.DEVICE), f"A/{i}", stats)
            self._compute(a_tile, b, c, i, stats)
            self.store.evict(a.tile(i))
            self._wait(self.store.evict(c.tile(i)), f"C/{i} written", stats)
            if progress:
                progress.update(1)
