"""Distributed gemm, atax and jacobi_2d over MPI (mpi4py), for weak and strong scaling. Runs under mpirun.

``mpirun -n P python -m terastack.repro.dace.scaling --preset smoke --out scaling_P.json``

[Note: decompositions]
- gemm ``C = alpha A B + beta C``: A and C split by rows, B split by rows and
  gathered whole on every rank (Allgatherv) inside the timed region; each rank
  then computes its rows of C.
- atax ``y = A^T (A x)``: A split by rows, x replicated; each rank computes
  ``(A_r x) A_r`` and an Allreduce sums the partial y.
- jacobi_2d: rows split in blocks; each rank holds its rows plus one halo row
  from each neighbour, exchanged (Sendrecv) before each half step.
Strong scaling keeps the global size fixed; weak scaling grows the split
dimension with P so each rank's share stays that of P = 1. Each rank computes
single-threaded (the driver sets the thread variables to 1), so P processes
use P cores. The rank-local compute is either the NumPy kernel or the same
kernel compiled by DaCe (``--locals numpy,dace``; each rank compiles into its
own build folder, before anything is timed); communication is mpi4py either way. The result of every (kernel, mode, P) is gathered on rank 0 and
validated against the serial NumPy kernel on the same global inputs before
anything is timed. Time of one run = from a barrier to the barrier after it
(the slowest rank).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from terastack.atomic import atomic_write_json
from terastack.repro.dace.kernel import Kernel, annotated, validate
from terastack.repro.dace.kernels.linalg import ATAX, GEMM, atax_numpy, gemm_numpy
from terastack.repro.dace.kernels.stencils import jacobi_2d_numpy
from terastack.repro.dace.stats import median_ci

#: kernel -> preset -> sizes at P = 1; ``split`` is the dimension divided among ranks (grown with P when weak)
SIZES = {
    "gemm": {"split": "NI", "smoke": dict(NI=512, NJ=512, NK=512), "small": dict(NI=1024, NJ=1024, NK=1024),
             "full": dict(NI=2048, NJ=2048, NK=2048)},
    "atax": {"split": "M", "smoke": dict(M=2048, N=2048), "small": dict(M=4096, N=4096),
             "full": dict(M=8192, N=8192)},
    "jacobi_2d": {"split": "R", "smoke": dict(R=512, C=512, TSTEPS=20), "small": dict(R=1024, C=1024, TSTEPS=40),
                  "full": dict(R=2048, C=2048, TSTEPS=60)},
}
#: preset -> timed repeats per (kernel, mode, P)
REPEATS = {"smoke": 5, "small": 7, "full": 7}
ROW_CHUNK = 64


def global_rows(seed: int, shape: tuple[int, int], start: int, end: int) -> np.ndarray:
    """Rows [start, end) of a seeded random matrix; any rank can make any rows without the rest.

    Generated in chunks of ROW_CHUNK rows, each from its own seed, so a slice equals the same
    rows of the whole matrix.
    """
    out = np.empty((end - start, shape[1]))
    for c in range(start // ROW_CHUNK, -(-end // ROW_CHUNK)):
        lo, hi = c * ROW_CHUNK, min((c + 1) * ROW_CHUNK, shape[0])
        block = np.random.default_rng([seed, c]).random((hi - lo, shape[1]))
        s, e = max(lo, start), min(hi, end)
        out[s - start:e - start] = block[s - lo:e - lo]
    return out


def block_range(n: int, size: int, rank: int) -> tuple[int, int]:
    return rank * n // size, (rank + 1) * n // size


def jacobi_sweep_numpy(src, dst):
    # one half step of jacobi_2d on a block whose first and last rows are halos (or the fixed boundary)
    dst[1:-1, 1:-1] = 0.2 * (src[1:-1, 1:-1] + src[1:-1, :-2] + src[1:-1, 2:] + src[2:, 1:-1] + src[:-2, 1:-1])


def _jacobi_sweep_dace():
    import dace

    R, C = dace.symbol("R"), dace.symbol("C")
    return annotated(jacobi_sweep_numpy, src=dace.float64[R, C], dst=dace.float64[R, C])


JACOBI_SWEEP = Kernel(name="jacobi_2d_sweep", domain="stencil", definition="one jacobi_2d half step on a block",
                      args=("src", "dst"), outputs=("dst",), sizes={p: {} for p in ("smoke", "small", "full")},
                      init=dict, numpy=jacobi_sweep_numpy, dace=_jacobi_sweep_dace)


class Local:
    """The rank-local compute of one kernel: NumPy's function, or DaCe's compiled for these shapes."""

    _compiled: dict = {}

    def __init__(self, framework: str, build_dir: str | None, rank: int):
        if framework not in ("numpy", "dace"):
            raise ValueError(f"--locals: must be numpy or dace, got {framework!r}")
        self.framework, self.build_dir, self.rank = framework, build_dir, rank

    def __call__(self, kernel: Kernel, example: dict):
        if self.framework == "numpy":
            return kernel.numpy
        key = (kernel.name, tuple((k, np.shape(v)) for k, v in sorted(example.items())))
        if key not in Local._compiled:
            from terastack.repro.dace.runner import configure_dace, dace_callable

            # every rank compiles its own copy: one build folder per rank, no races between them
            configure_dace(os.path.join(self.build_dir or ".dacecache", f"rank{self.rank}"))
            Local._compiled[key] = dace_callable(kernel, True, example)
        return Local._compiled[key]


# --------------------------------------------------------------------------- gemm


class DistGemm:
    name = "gemm"

    def __init__(self, comm, local: Local, NI: int, NJ: int, NK: int):
        self.comm, self.shape = comm, (NI, NJ, NK)
        r, p = comm.Get_rank(), comm.Get_size()
        self.rows = block_range(NI, p, r)
        self.brows = block_range(NK, p, r)
        self.A = global_rows(1, (NI, NK), *self.rows)
        self.C = global_rows(2, (NI, NJ), *self.rows)
        self.B_local = global_rows(3, (NK, NJ), *self.brows)
        counts = [(block_range(NK, p, q)[1] - block_range(NK, p, q)[0]) * NJ for q in range(p)]
        self.counts, self.displs = counts, [sum(counts[:q]) for q in range(p)]
        self.B = np.empty((NK, NJ))
        self.gemm = local(GEMM, {"alpha": 1.5, "beta": 1.2, "C": self.C, "A": self.A, "B": self.B})

    def fresh(self) -> dict:
        return {"C": self.C.copy()}

    def run(self, state: dict) -> None:
        from mpi4py import MPI

        self.comm.Allgatherv(self.B_local, [self.B, self.counts, self.displs, MPI.DOUBLE])
        self.gemm(1.5, 1.2, state["C"], self.A, self.B)

    def gathered(self, state: dict):
        parts = self.comm.gather(state["C"], root=0)
        return [np.concatenate(parts)] if parts is not None else None

    def reference(self):
        NI, NJ, NK = self.shape
        C = global_rows(2, (NI, NJ), 0, NI)
        gemm_numpy(1.5, 1.2, C, global_rows(1, (NI, NK), 0, NI), global_rows(3, (NK, NJ), 0, NK))
        return [C], dict(rtol=1e-10, atol=1e-9)


# --------------------------------------------------------------------------- atax


class DistAtax:
    name = "atax"

    def __init__(self, comm, local: Local, M: int, N: int):
        self.comm, self.shape = comm, (M, N)
        self.A = global_rows(4, (M, N), *block_range(M, comm.Get_size(), comm.Get_rank()))
        self.x = global_rows(5, (1, N), 0, 1)[0].copy()    # DaCe takes no views
        self.atax = local(ATAX, {"A": self.A, "x": self.x})

    def fresh(self) -> dict:
        return {"y": np.empty(self.shape[1])}

    def run(self, state: dict) -> None:
        from mpi4py import MPI

        partial = np.ascontiguousarray(self.atax(self.A, self.x))
        self.comm.Allreduce(partial, state["y"], op=MPI.SUM)

    def gathered(self, state: dict):
        return [state["y"]] if self.comm.Get_rank() == 0 else None

    def reference(self):
        M, N = self.shape
        return [atax_numpy(global_rows(4, (M, N), 0, M), global_rows(5, (1, N), 0, 1)[0])], dict(rtol=1e-10, atol=1e-8)


# --------------------------------------------------------------------------- jacobi_2d


class DistJacobi2d:
    name = "jacobi_2d"

    def __init__(self, comm, local: Local, R: int, C: int, TSTEPS: int):
        self.comm, self.shape, self.tsteps = comm, (R, C), TSTEPS
        r, p = comm.Get_rank(), comm.Get_size()
        self.s, self.e = block_range(R, p, r)
        # local rows cover [lo, hi): own rows plus one halo row from each neighbour that exists
        self.lo, self.hi = max(self.s - 1, 0), min(self.e + 1, R)
        self.A = global_rows(6, (R, C), self.lo, self.hi)
        self.B = global_rows(7, (R, C), self.lo, self.hi)
        from mpi4py import MPI

        self.up = r - 1 if r > 0 else MPI.PROC_NULL
        self.down = r + 1 if r < p - 1 else MPI.PROC_NULL
        # The block's first and last rows are halos or the fixed global boundary, so a half step
        # updates exactly the block's interior rows: this rank's own rows, less global rows 0 and R-1.
        self.sweep = local(JACOBI_SWEEP, {"src": self.A, "dst": self.B})

    def fresh(self) -> dict:
        return {"A": self.A.copy(), "B": self.B.copy()}

    def _halo(self, X: np.ndarray) -> None:
        s, e, lo = self.s, self.e, self.lo
        # first own row goes up, the bottom halo comes from below; then the mirror image
        self.comm.Sendrecv(X[s - lo], dest=self.up, recvbuf=X[e - lo] if e < self.shape[0] else None,
                           source=self.down)
        self.comm.Sendrecv(X[e - 1 - lo], dest=self.down, recvbuf=X[s - 1 - lo] if s > 0 else None,
                           source=self.up)

    def run(self, state: dict) -> None:
        A, B = state["A"], state["B"]
        for _t in range(1, self.tsteps):
            self._halo(A)
            self.sweep(A, B)
            self._halo(B)
            self.sweep(B, A)

    def gathered(self, state: dict):
        own = slice(self.s - self.lo, self.e - self.lo)
        a = self.comm.gather(state["A"][own], root=0)
        b = self.comm.gather(state["B"][own], root=0)
        return [np.concatenate(a), np.concatenate(b)] if a is not None else None

    def reference(self):
        R, C = self.shape
        A, B = global_rows(6, (R, C), 0, R), global_rows(7, (R, C), 0, R)
        jacobi_2d_numpy(self.tsteps, A, B)
        return [A, B], dict(rtol=1e-10, atol=1e-12)


KERNELS = {"gemm": DistGemm, "atax": DistAtax, "jacobi_2d": DistJacobi2d}


def sizes_for(kernel: str, preset: str, mode: str, procs: int) -> dict:
    spec = SIZES[kernel]
    sizes = dict(spec[preset])
    if mode == "weak":
        sizes[spec["split"]] *= procs
    elif mode != "strong":
        raise ValueError(f"mode: must be 'weak' or 'strong', got {mode!r}")
    return sizes


def measure(comm, kernel: str, preset: str, mode: str, repeats: int, local: Local) -> dict | None:
    procs = comm.Get_size()
    sizes = sizes_for(kernel, preset, mode, procs)
    job = KERNELS[kernel](comm, local, **sizes)
    # validation run, untimed
    state = job.fresh()
    job.run(state)
    got = job.gathered(state)
    check = None
    if comm.Get_rank() == 0:
        reference, tol = job.reference()
        check = validate(reference, got, **tol).as_dict()
    check = comm.bcast(check, root=0)
    times = []
    if check["ok"]:
        for _ in range(repeats):
            state = job.fresh()              # copies made before the clock starts
            comm.Barrier()
            start = time.perf_counter()
            job.run(state)
            comm.Barrier()
            times.append(time.perf_counter() - start)
    if comm.Get_rank() != 0:
        return None
    rec = {"kernel": kernel, "mode": mode, "local": local.framework, "procs": procs, "sizes": sizes,
           "validation": check, "times_s": times}
    if times:
        rec.update(median_ci(times))
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m terastack.repro.dace.scaling", description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=tuple(REPEATS), default="smoke")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--modes", default="strong,weak")
    p.add_argument("--locals", default="numpy", help="rank-local compute: numpy, dace or both (comma-separated)")
    p.add_argument("--build-dir", help="DaCe build folder (one subfolder per rank)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    records = []
    for framework in args.locals.split(","):
        local = Local(framework, args.build_dir, comm.Get_rank())
        for kernel in args.kernels.split(","):
            if kernel not in KERNELS:
                raise ValueError(f"--kernels: unknown {kernel!r}; choose from {','.join(KERNELS)}")
            for mode in args.modes.split(","):
                rec = measure(comm, kernel, args.preset, mode, REPEATS[args.preset], local)
                if rec is not None:
                    records.append(rec)
                    shown = (f"median {rec['median'] * 1e3:.2f} ms" if rec["times_s"]
                             else f"INVALID {rec['validation']}")
                    print(f"[dace-suite] scaling {kernel} ({framework}) {mode} P={comm.Get_size()}: {shown}",
                          file=sys.stderr, flush=True)
    if comm.Get_rank() == 0:
        atomic_write_json(args.out, {"procs": comm.Get_size(), "preset": args.preset,
                                     "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
                                     "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
