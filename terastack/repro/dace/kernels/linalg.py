"""Dense linear algebra kernels (PolyBench's BLAS-like group): gemm, atax, bicg, mvt, gesummv, k2mm.

Each is NumPy from its definition; the DaCe form is the same code annotated;
the Numba form is the same code under ``@njit`` (Numba maps ``@`` to BLAS
through SciPy, as NumPy does), see [Note: one algorithm, three frameworks].
"""
# No `from __future__ import annotations`: DaCe evaluates the type annotations of its programs.

import numpy as np

from terastack.repro.dace.kernel import Kernel, rng

# --------------------------------------------------------------------------- gemm


def gemm_init(NI: int, NJ: int, NK: int) -> dict:
    r = rng(1)
    return {"alpha": 1.5, "beta": 1.2, "C": r.random((NI, NJ)), "A": r.random((NI, NK)), "B": r.random((NK, NJ))}


def gemm_numpy(alpha, beta, C, A, B):
    C[:] = alpha * A @ B + beta * C


def gemm_dace():
    import dace

    NI, NJ, NK = (dace.symbol(s) for s in ("NI", "NJ", "NK"))

    def gemm(alpha: dace.float64, beta: dace.float64, C: dace.float64[NI, NJ], A: dace.float64[NI, NK],
             B: dace.float64[NK, NJ]):
        C[:] = alpha * A @ B + beta * C

    return gemm


def gemm_numba():
    import numba

    @numba.njit(cache=False)
    def gemm(alpha, beta, C, A, B):
        C[:] = alpha * A @ B + beta * C

    return gemm


GEMM = Kernel(
    name="gemm", domain="linear algebra", definition="C = alpha A B + beta C",
    args=("alpha", "beta", "C", "A", "B"), outputs=("C",),
    sizes={"smoke": dict(NI=400, NJ=450, NK=480), "small": dict(NI=1100, NJ=1200, NK=1300),
           "full": dict(NI=2400, NJ=2600, NK=2800)},
    init=gemm_init, numpy=gemm_numpy, dace=gemm_dace, numba=gemm_numba,
    rtol=1e-10, atol=1e-9, tolerance_note="BLAS blocking changes the summation order")

# --------------------------------------------------------------------------- atax


def atax_init(M: int, N: int) -> dict:
    r = rng(2)
    return {"A": r.random((M, N)), "x": r.random(N)}


def atax_numpy(A, x):
    return (A @ x) @ A


def atax_dace():
    import dace

    M, N = dace.symbol("M"), dace.symbol("N")

    def atax(A: dace.float64[M, N], x: dace.float64[N]):
        return (A @ x) @ A

    return atax


def atax_numba():
    import numba

    @numba.njit(cache=False)
    def atax(A, x):
        return (A @ x) @ A

    return atax


ATAX = Kernel(
    name="atax", domain="linear algebra", definition="y = A^T (A x)",
    args=("A", "x"), returns=1,
    sizes={"smoke": dict(M=2700, N=3000), "small": dict(M=7200, N=8200), "full": dict(M=12000, N=13000)},
    init=atax_init, numpy=atax_numpy, dace=atax_dace, numba=atax_numba, rtol=1e-10, atol=1e-8)

# --------------------------------------------------------------------------- bicg


def bicg_init(M: int, N: int) -> dict:
    r = rng(3)
    return {"A": r.random((N, M)), "p": r.random(M), "r": r.random(N)}


def bicg_numpy(A, p, r):
    return r @ A, A @ p


def bicg_dace():
    import dace

    M, N = dace.symbol("M"), dace.symbol("N")

    def bicg(A: dace.float64[N, M], p: dace.float64[M], r: dace.float64[N]):
        return r @ A, A @ p

    return bicg


def bicg_numba():
    import numba

    @numba.njit(cache=False)
    def bicg(A, p, r):
        return r @ A, A @ p

    return bicg


BICG = Kernel(
    name="bicg", domain="linear algebra", definition="s = A^T r,  q = A p",
    args=("A", "p", "r"), returns=2,
    sizes={"smoke": dict(M=2600, N=2800), "small": dict(M=6600, N=7500), "full": dict(M=12000, N=13000)},
    init=bicg_init, numpy=bicg_numpy, dace=bicg_dace, numba=bicg_numba, rtol=1e-10, atol=1e-8)

# --------------------------------------------------------------------------- mvt


def mvt_init(N: int) -> dict:
    r = rng(4)
    return {"x1": r.random(N), "x2": r.random(N), "y_1": r.random(N), "y_2": r.random(N), "A": r.random((N, N))}


def mvt_numpy(x1, x2, y_1, y_2, A):
    x1 += A @ y_1
    x2 += y_2 @ A


def mvt_dace():
    import dace

    N = dace.symbol("N")

    def mvt(x1: dace.float64[N], x2: dace.float64[N], y_1: dace.float64[N], y_2: dace.float64[N],
            A: dace.float64[N, N]):
        x1 += A @ y_1
        x2 += y_2 @ A

    return mvt


def mvt_numba():
    import numba

    @numba.njit(cache=False)
    def mvt(x1, x2, y_1, y_2, A):
        x1 += A @ y_1
        x2 += y_2 @ A

    return mvt


MVT = Kernel(
    name="mvt", domain="linear algebra", definition="x1 += A y1,  x2 += A^T y2",
    args=("x1", "x2", "y_1", "y_2", "A"), outputs=("x1", "x2"),
    sizes={"smoke": dict(N=2300), "small": dict(N=6900), "full": dict(N=12500)},
    init=mvt_init, numpy=mvt_numpy, dace=mvt_dace, numba=mvt_numba, rtol=1e-10, atol=1e-8)

# --------------------------------------------------------------------------- gesummv


def gesummv_init(N: int) -> dict:
    r = rng(5)
    return {"alpha": 1.5, "beta": 1.2, "A": r.random((N, N)), "B": r.random((N, N)), "x": r.random(N)}


def gesummv_numpy(alpha, beta, A, B, x):
    return alpha * A @ x + beta * B @ x


def gesummv_dace():
    import dace

    N = dace.symbol("N")

    def gesummv(alpha: dace.float64, beta: dace.float64, A: dace.float64[N, N], B: dace.float64[N, N],
                x: dace.float64[N]):
        return alpha * A @ x + beta * B @ x

    return gesummv


def gesummv_numba():
    import numba

    @numba.njit(cache=False)
    def gesummv(alpha, beta, A, B, x):
        return alpha * A @ x + beta * B @ x

    return gesummv


GESUMMV = Kernel(
    name="gesummv", domain="linear algebra", definition="y = alpha A x + beta B x",
    args=("alpha", "beta", "A", "B", "x"), returns=1,
    sizes={"smoke": dict(N=2600), "small": dict(N=6000), "full": dict(N=9000)},
    init=gesummv_init, numpy=gesummv_numpy, dace=gesummv_dace, numba=gesummv_numba, rtol=1e-10, atol=1e-8)

# --------------------------------------------------------------------------- k2mm


def k2mm_init(NI: int, NJ: int, NK: int, NL: int) -> dict:
    r = rng(6)
    return {"alpha": 1.5, "beta": 1.2, "A": r.random((NI, NK)), "B": r.random((NK, NJ)), "C": r.random((NJ, NL)),
            "D": r.random((NI, NL))}


def k2mm_numpy(alpha, beta, A, B, C, D):
    D[:] = alpha * A @ B @ C + beta * D


def k2mm_dace():
    import dace

    NI, NJ, NK, NL = (dace.symbol(s) for s in ("NI", "NJ", "NK", "NL"))

    def k2mm(alpha: dace.float64, beta: dace.float64, A: dace.float64[NI, NK], B: dace.float64[NK, NJ],
             C: dace.float64[NJ, NL], D: dace.float64[NI, NL]):
        D[:] = alpha * A @ B @ C + beta * D

    return k2mm


def k2mm_numba():
    import numba

    @numba.njit(cache=False)
    def k2mm(alpha, beta, A, B, C, D):
        D[:] = alpha * A @ B @ C + beta * D

    return k2mm


K2MM = Kernel(
    name="k2mm", domain="linear algebra", definition="D = alpha A B C + beta D",
    args=("alpha", "beta", "A", "B", "C", "D"), outputs=("D",),
    sizes={"smoke": dict(NI=490, NJ=550, NK=610, NL=670), "small": dict(NI=1200, NJ=1270, NK=1340, NL=1400),
           "full": dict(NI=2700, NJ=2800, NK=3000, NL=3100)},
    init=k2mm_init, numpy=k2mm_numpy, dace=k2mm_dace, numba=k2mm_numba,
    rtol=1e-10, atol=1e-7, tolerance_note="two chained BLAS products; summation order differs")

KERNELS = [GEMM, ATAX, BICG, MVT, GESUMMV, K2MM]
