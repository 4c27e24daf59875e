"""Deep-learning kernels: softmax over the last axis, 2-D convolution with bias (NHWC, valid padding)."""
# No `from __future__ import annotations`: DaCe evaluates the type annotations of its programs.

import numpy as np

from terastack.repro.dace.kernel import Kernel, annotated, rng

# --------------------------------------------------------------------------- softmax


def softmax_init(N: int, H: int, SM: int) -> dict:
    r = rng(10)
    return {"x": r.random((N, H, SM, SM))}


def softmax_numpy(x):
    # Subtracting the row maximum keeps exp() in range; it cancels in the quotient. The reduced
    # axis is restored with np.newaxis rather than keepdims=True, which DaCe 1.0.2 does not take.
    tmp_max = np.max(x, axis=-1)
    tmp_out = np.exp(x - tmp_max[:, :, :, np.newaxis])
    tmp_sum = np.sum(tmp_out, axis=-1)
    return tmp_out / tmp_sum[:, :, :, np.newaxis]


def softmax_dace():
    import dace

    N, H, SM = dace.symbol("N"), dace.symbol("H"), dace.symbol("SM")
    return annotated(softmax_numpy, x=dace.float64[N, H, SM, SM])


def softmax_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def softmax(x):
        n, h, s1, s2 = x.shape
        out = np.empty_like(x)
        for a in numba.prange(n * h):
            i, j = a // h, a % h
            for k in range(s1):
                m = x[i, j, k, 0]
                for l in range(1, s2):
                    m = max(m, x[i, j, k, l])
                s = 0.0
                for l in range(s2):
                    e = np.exp(x[i, j, k, l] - m)
                    out[i, j, k, l] = e
                    s += e
                for l in range(s2):
                    out[i, j, k, l] /= s
        return out

    return softmax


SOFTMAX = Kernel(
    name="softmax", domain="deep learning", definition="y_i = exp(x_i - max x) / sum_j exp(x_j - max x) over the last axis",
    args=("x",), returns=1,
    sizes={"smoke": dict(N=16, H=8, SM=96), "small": dict(N=32, H=16, SM=180), "full": dict(N=32, H=16, SM=400)},
    init=softmax_init, numpy=softmax_numpy, dace=softmax_dace, numba=softmax_numba,
    extras={"dace_note": "the NumPy code restores the reduced axis with np.newaxis: DaCe 1.0.2 rejects keepdims"},
    rtol=1e-10, atol=1e-14, tolerance_note="vectorized exp may differ by an ulp")

# --------------------------------------------------------------------------- conv2d with bias


def conv2d_init(N: int, H: int, W: int, C_in: int, C_out: int, K: int) -> dict:
    r = rng(11)
    return {"input": r.random((N, H, W, C_in)), "weights": r.random((K, K, C_in, C_out)), "bias": r.random(C_out)}


def conv2d_numpy(input, weights, bias):
    # out[n,i,j,co] = bias[co] + sum_{p,q,ci} input[n,i+p,j+q,ci] * weights[p,q,ci,co]
    K = weights.shape[0]
    N, H, W, _ = input.shape
    H_out, W_out = H - K + 1, W - K + 1
    out = np.empty((N, H_out, W_out, weights.shape[3]))
    out[:] = bias
    for p in range(K):
        for q in range(K):
            out += input[:, p:p + H_out, q:q + W_out, :] @ weights[p, q]
    return out


def conv2d_dace():
    import dace

    N, H, W, C_in, C_out, K = (dace.symbol(s) for s in ("N", "H", "W", "C_in", "C_out", "K"))

    # The same (p, q) loop as the NumPy form, with the per-offset product written as a map over the
    # outputs. (A map whose body loops over p and q and indexes input[n, i + p, ...] is miscompiled
    # by DaCe 1.0.2 — every output but the first gets the wrong window — so the offsets stay outside.)
    def conv2d_bias(input: dace.float64[N, H, W, C_in], weights: dace.float64[K, K, C_in, C_out],
                    bias: dace.float64[C_out]):
        out = np.ndarray((N, H - K + 1, W - K + 1, C_out), dtype=np.float64)
        out[:] = bias
        for p in range(K):
            for q in range(K):
                for n, i, j, co in dace.map[0:N, 0:H - K + 1, 0:W - K + 1, 0:C_out]:
                    for ci in range(C_in):
                        out[n, i, j, co] += input[n, i + p, j + q, ci] * weights[p, q, ci, co]
        return out

    return conv2d_bias


def conv2d_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def conv2d_bias(input, weights, bias):
        K = weights.shape[0]
        N, H, W, C_in = input.shape
        C_out = weights.shape[3]
        H_out, W_out = H - K + 1, W - K + 1
        out = np.empty((N, H_out, W_out, C_out))
        for a in numba.prange(N * H_out):
            n, i = a // H_out, a % H_out
            for j in range(W_out):
                for co in range(C_out):
                    out[n, i, j, co] = bias[co]
                for p in range(K):
                    for q in range(K):
                        for ci in range(C_in):
                            v = input[n, i + p, j + q, ci]
                            for co in range(C_out):
                                out[n, i, j, co] += v * weights[p, q, ci, co]
        return out

    return conv2d_bias


CONV2D = Kernel(
    name="conv2d_bias", domain="deep learning",
    definition="out[n,i,j,co] = b[co] + sum_{p,q,ci} in[n,i+p,j+q,ci] w[p,q,ci,co] (NHWC, valid)",
    args=("input", "weights", "bias"), returns=1,
    sizes={"smoke": dict(N=8, H=80, W=80, C_in=3, C_out=16, K=5),
           "small": dict(N=32, H=80, W=80, C_in=3, C_out=32, K=5),
           "full": dict(N=32, H=128, W=128, C_in=3, C_out=32, K=7)},
    init=conv2d_init, numpy=conv2d_numpy, dace=conv2d_dace, numba=conv2d_numba,
    extras={"dace_note": "a map over the outputs inside the (p, q) loop; the form with the (p, q) loops inside "
                         "the map is miscompiled by DaCe 1.0.2 (wrong window for every output but the first)"},
    rtol=1e-10, atol=1e-10, tolerance_note="the sum over (p, q, ci) is accumulated in different orders")

KERNELS = [SOFTMAX, CONV2D]
