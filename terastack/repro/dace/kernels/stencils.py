"""Stencil kernels: jacobi_1d, jacobi_2d, heat_3d (PolyBench definitions, TSTEPS time steps).

Each time step computes B from A, then A from B, on the interior only (the
boundary stays fixed). DaCe runs the NumPy function itself, annotated; Numba
uses explicit loops with ``prange`` over the outermost dimension, the
idiomatic Numba stencil.
"""
# No `from __future__ import annotations`: DaCe evaluates the type annotations of its programs.


from terastack.repro.dace.kernel import Kernel, annotated, rng

def _time_steps(sweep):
    """Numba: TSTEPS - 1 steps of ``sweep(A, B)`` then ``sweep(B, A)`` — the time loop all three stencils share."""
    import numba

    @numba.njit(cache=False)
    def run(TSTEPS, A, B):
        for _t in range(1, TSTEPS):
            sweep(A, B)
            sweep(B, A)

    return run


# --------------------------------------------------------------------------- jacobi_1d


def jacobi_1d_init(N: int, TSTEPS: int) -> dict:
    r = rng(7)
    return {"TSTEPS": TSTEPS, "A": r.random(N), "B": r.random(N)}


def jacobi_1d_numpy(TSTEPS, A, B):
    for _t in range(1, TSTEPS):
        B[1:-1] = (A[:-2] + A[1:-1] + A[2:]) / 3.0
        A[1:-1] = (B[:-2] + B[1:-1] + B[2:]) / 3.0


def jacobi_1d_dace():
    import dace

    N = dace.symbol("N")
    return annotated(jacobi_1d_numpy, TSTEPS=dace.int64, A=dace.float64[N], B=dace.float64[N])


def jacobi_1d_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def _sweep(src, dst):
        for i in numba.prange(1, src.shape[0] - 1):
            dst[i] = (src[i - 1] + src[i] + src[i + 1]) / 3.0

    return _time_steps(_sweep)


JACOBI_1D = Kernel(
    name="jacobi_1d", domain="stencil", definition="B_i = (A_{i-1} + A_i + A_{i+1}) / 3, then A from B; TSTEPS steps",
    args=("TSTEPS", "A", "B"), outputs=("A", "B"),
    sizes={"smoke": dict(N=20000, TSTEPS=120), "small": dict(N=60000, TSTEPS=800),
           "full": dict(N=200000, TSTEPS=2400)},
    init=jacobi_1d_init, numpy=jacobi_1d_numpy, dace=jacobi_1d_dace, numba=jacobi_1d_numba,
    rtol=1e-10, atol=1e-12, tolerance_note="division may compile to multiplication by 1/3 (fast-math)")

# --------------------------------------------------------------------------- jacobi_2d


def jacobi_2d_init(N: int, TSTEPS: int) -> dict:
    r = rng(8)
    return {"TSTEPS": TSTEPS, "A": r.random((N, N)), "B": r.random((N, N))}


def jacobi_2d_numpy(TSTEPS, A, B):
    for _t in range(1, TSTEPS):
        B[1:-1, 1:-1] = 0.2 * (A[1:-1, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:] + A[2:, 1:-1] + A[:-2, 1:-1])
        A[1:-1, 1:-1] = 0.2 * (B[1:-1, 1:-1] + B[1:-1, :-2] + B[1:-1, 2:] + B[2:, 1:-1] + B[:-2, 1:-1])


def jacobi_2d_dace():
    import dace

    N = dace.symbol("N")
    return annotated(jacobi_2d_numpy, TSTEPS=dace.int64, A=dace.float64[N, N], B=dace.float64[N, N])


def jacobi_2d_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def _sweep(src, dst):
        n = src.shape[0]
        for i in numba.prange(1, n - 1):
            for j in range(1, n - 1):
                dst[i, j] = 0.2 * (src[i, j] + src[i, j - 1] + src[i, j + 1] + src[i + 1, j] + src[i - 1, j])

    return _time_steps(_sweep)


JACOBI_2D = Kernel(
    name="jacobi_2d", domain="stencil", definition="B = 0.2 (A_c + A_w + A_e + A_n + A_s) on the interior, then A from B",
    args=("TSTEPS", "A", "B"), outputs=("A", "B"),
    sizes={"smoke": dict(N=160, TSTEPS=40), "small": dict(N=560, TSTEPS=70), "full": dict(N=1000, TSTEPS=160)},
    init=jacobi_2d_init, numpy=jacobi_2d_numpy, dace=jacobi_2d_dace, numba=jacobi_2d_numba,
    rtol=1e-10, atol=1e-12)

# --------------------------------------------------------------------------- heat_3d


def heat_3d_init(N: int, TSTEPS: int) -> dict:
    r = rng(9)
    return {"TSTEPS": TSTEPS, "A": r.random((N, N, N)), "B": r.random((N, N, N))}


def heat_3d_numpy(TSTEPS, A, B):
    for _t in range(1, TSTEPS):
        B[1:-1, 1:-1, 1:-1] = (
            0.125 * (A[2:, 1:-1, 1:-1] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[:-2, 1:-1, 1:-1])
            + 0.125 * (A[1:-1, 2:, 1:-1] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[1:-1, :-2, 1:-1])
            + 0.125 * (A[1:-1, 1:-1, 2:] - 2.0 * A[1:-1, 1:-1, 1:-1] + A[1:-1, 1:-1, :-2])
            + A[1:-1, 1:-1, 1:-1])
        A[1:-1, 1:-1, 1:-1] = (
            0.125 * (B[2:, 1:-1, 1:-1] - 2.0 * B[1:-1, 1:-1, 1:-1] + B[:-2, 1:-1, 1:-1])
            + 0.125 * (B[1:-1, 2:, 1:-1] - 2.0 * B[1:-1, 1:-1, 1:-1] + B[1:-1, :-2, 1:-1])
            + 0.125 * (B[1:-1, 1:-1, 2:] - 2.0 * B[1:-1, 1:-1, 1:-1] + B[1:-1, 1:-1, :-2])
            + B[1:-1, 1:-1, 1:-1])


def heat_3d_dace():
    import dace

    N = dace.symbol("N")
    return annotated(heat_3d_numpy, TSTEPS=dace.int64, A=dace.float64[N, N, N], B=dace.float64[N, N, N])


def heat_3d_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def _step(src, dst):
        n = src.shape[0]
        for i in numba.prange(1, n - 1):
            for j in range(1, n - 1):
                for k in range(1, n - 1):
                    c = src[i, j, k]
                    dst[i, j, k] = (0.125 * (src[i + 1, j, k] - 2.0 * c + src[i - 1, j, k])
                                    + 0.125 * (src[i, j + 1, k] - 2.0 * c + src[i, j - 1, k])
                                    + 0.125 * (src[i, j, k + 1] - 2.0 * c + src[i, j, k - 1]) + c)

    return _time_steps(_step)


HEAT_3D = Kernel(
    name="heat_3d", domain="stencil", definition="B = A + 0.125 (d2A/dx2 + d2A/dy2 + d2A/dz2) (7-point), then A from B",
    args=("TSTEPS", "A", "B"), outputs=("A", "B"),
    sizes={"smoke": dict(N=25, TSTEPS=30), "small": dict(N=35, TSTEPS=140), "full": dict(N=90, TSTEPS=90)},
    init=heat_3d_init, numpy=heat_3d_numpy, dace=heat_3d_dace, numba=heat_3d_numba,
    rtol=1e-10, atol=1e-12)

KERNELS = [JACOBI_1D, JACOBI_2D, HEAT_3D]
