"""Dense linear algebra kernels (PolyBench's BLAS-like group): gemm, atax, bicg, mvt, gesummv, k2mm.

The NumPy code of each is valid DaCe and valid Numba, so all three frameworks
run the very same function: DaCe with its argument types declared
(:func:`annotated`), Numba under ``@njit`` (which maps ``@`` to BLAS through
SciPy, as NumPy does). See [Note: one algorithm, three frameworks].
"""
# No `from __future__ import annotations`: DaCe evaluates the type annotations of its programs.

from terastack.repro.dace.kernel import Kernel, annotated, njit, rng


def _symbols(*names):
    import dace

    return [dace.symbol(n) for n in names]


# --------------------------------------------------------------------------- gemm


def gemm_init(NI: int, NJ: int, NK: int) -> dict:
    r = rng(1)
    return {"alpha": 1.5, "beta": 1.2, "C": r.random((NI, NJ)), "A": r.random((NI, NK)), "B": r.random((NK, NJ))}


def gemm_numpy(alpha, beta, C, A, B):
    C[:] = alpha * A @ B + beta * C


def gemm_dace():
    import dace

    NI, NJ, NK = _symbols("NI", "NJ", "NK")
    return annotated(gemm_numpy, alpha=dace.float64, beta=dace.float64, C=dace.float64[NI, NJ],
                     A=dace.float64[NI, NK], B=dace.float64[NK, NJ])


GEMM = Kernel(
    name="gemm", domain="linear algebra", definition="C = alpha A B + beta C",
    args=("alpha", "beta", "C", "A", "B"), outputs=("C",),
    sizes={"smoke": dict(NI=400, NJ=450, NK=480), "small": dict(NI=1100, NJ=1200, NK=1300),
           "full": dict(NI=2400, NJ=2600, NK=2800)},
    init=gemm_init, numpy=gemm_numpy, dace=gemm_dace, numba=lambda: njit(gemm_numpy),
    rtol=1e-10, atol=1e-9, tolerance_note="BLAS blocking changes the summation order")

# --------------------------------------------------------------------------- atax


def atax_init(M: int, N: int) -> dict:
    r = rng(2)
    return {"A": r.random((M, N)), "x": r.random(N)}


def atax_numpy(A, x):
    return (A @ x) @ A


def atax_dace():
    import dace

    M, N = _symbols("M", "N")
    return annotated(atax_numpy, A=dace.float64[M, N], x=dace.float64[N])


ATAX = Kernel(
    name="atax", domain="linear algebra", definition="y = A^T (A x)",
    args=("A", "x"), returns=1,
    sizes={"smoke": dict(M=2700, N=3000), "small": dict(M=7200, N=8200), "full": dict(M=12000, N=13000)},
    init=atax_init, numpy=atax_numpy, dace=atax_dace, numba=lambda: njit(atax_numpy), rtol=1e-10, atol=1e-8,
    extras={"size_note": "memory-bound: 'full' is capped at a 1.2 GB matrix (the 4 GiB per-process limit)"})

# --------------------------------------------------------------------------- bicg


def bicg_init(M: int, N: int) -> dict:
    r = rng(3)
    return {"A": r.random((N, M)), "p": r.random(M), "r": r.random(N)}


def bicg_numpy(A, p, r):
    return r @ A, A @ p


def bicg_dace():
    import dace

    M, N = _symbols("M", "N")
    return annotated(bicg_numpy, A=dace.float64[N, M], p=dace.float64[M], r=dace.float64[N])


BICG = Kernel(
    name="bicg", domain="linear algebra", definition="s = A^T r,  q = A p",
    args=("A", "p", "r"), returns=2,
    sizes={"smoke": dict(M=2600, N=2800), "small": dict(M=6600, N=7500), "full": dict(M=12000, N=13000)},
    init=bicg_init, numpy=bicg_numpy, dace=bicg_dace, numba=lambda: njit(bicg_numpy), rtol=1e-10, atol=1e-8,
    extras={"size_note": "memory-bound: 'full' is capped at a 1.2 GB matrix (the 4 GiB per-process limit)"})

# --------------------------------------------------------------------------- mvt


def mvt_init(N: int) -> dict:
    r = rng(4)
    return {"x1": r.random(N), "x2": r.random(N), "y_1": r.random(N), "y_2": r.random(N), "A": r.random((N, N))}


def mvt_numpy(x1, x2, y_1, y_2, A):
    x1 += A @ y_1
    x2 += y_2 @ A


def mvt_dace():
    import dace

    (N,) = _symbols("N")
    vec = dace.float64[N]
    return annotated(mvt_numpy, x1=vec, x2=vec, y_1=vec, y_2=vec, A=dace.float64[N, N])


MVT = Kernel(
    name="mvt", domain="linear algebra", definition="x1 += A y1,  x2 += A^T y2",
    args=("x1", "x2", "y_1", "y_2", "A"), outputs=("x1", "x2"),
    sizes={"smoke": dict(N=2300), "small": dict(N=6900), "full": dict(N=12500)},
    init=mvt_init, numpy=mvt_numpy, dace=mvt_dace, numba=lambda: njit(mvt_numpy), rtol=1e-10, atol=1e-8,
    extras={"size_note": "memory-bound: 'full' is capped at a 1.25 GB matrix (the 4 GiB per-process limit)"})

# --------------------------------------------------------------------------- gesummv


def gesummv_init(N: int) -> dict:
    r = rng(5)
    return {"alpha": 1.5, "beta": 1.2, "A": r.random((N, N)), "B": r.random((N, N)), "x": r.random(N)}


def gesummv_numpy(alpha, beta, A, B, x):
    return alpha * A @ x + beta * B @ x


def gesummv_dace():
    import dace

    (N,) = _symbols("N")
    return annotated(gesummv_numpy, alpha=dace.float64, beta=dace.float64, A=dace.float64[N, N],
                     B=dace.float64[N, N], x=dace.float64[N])


GESUMMV = Kernel(
    name="gesummv", domain="linear algebra", definition="y = alpha A x + beta B x",
    args=("alpha", "beta", "A", "B", "x"), returns=1,
    sizes={"smoke": dict(N=2600), "small": dict(N=6000), "full": dict(N=9000)},
    init=gesummv_init, numpy=gesummv_numpy, dace=gesummv_dace, numba=lambda: njit(gesummv_numpy),
    rtol=1e-10, atol=1e-8,
    extras={"size_note": "memory-bound: 'full' is capped at two 0.65 GB matrices (the 4 GiB per-process limit)"})

# --------------------------------------------------------------------------- k2mm


def k2mm_init(NI: int, NJ: int, NK: int, NL: int) -> dict:
    r = rng(6)
    return {"alpha": 1.5, "beta": 1.2, "A": r.random((NI, NK)), "B": r.random((NK, NJ)), "C": r.random((NJ, NL)),
            "D": r.random((NI, NL))}


def k2mm_numpy(alpha, beta, A, B, C, D):
    D[:] = alpha * A @ B @ C + beta * D


def k2mm_dace():
    import dace

    NI, NJ, NK, NL = _symbols("NI", "NJ", "NK", "NL")
    return annotated(k2mm_numpy, alpha=dace.float64, beta=dace.float64, A=dace.float64[NI, NK],
                     B=dace.float64[NK, NJ], C=dace.float64[NJ, NL], D=dace.float64[NI, NL])


K2MM = Kernel(
    name="k2mm", domain="linear algebra", definition="D = alpha A B C + beta D",
    args=("alpha", "beta", "A", "B", "C", "D"), outputs=("D",),
    sizes={"smoke": dict(NI=490, NJ=550, NK=610, NL=670), "small": dict(NI=1200, NJ=1270, NK=1340, NL=1400),
           "full": dict(NI=2700, NJ=2800, NK=3000, NL=3100)},
    init=k2mm_init, numpy=k2mm_numpy, dace=k2mm_dace, numba=lambda: njit(k2mm_numpy),
    rtol=1e-10, atol=1e-7, tolerance_note="two chained BLAS products; summation order differs")

KERNELS = [GEMM, ATAX, BICG, MVT, GESUMMV, K2MM]
