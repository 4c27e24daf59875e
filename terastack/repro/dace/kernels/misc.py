"""Irregular kernels: sparse matrix-vector product (CSR) and CRC-16 (a sequential bit loop)."""
# No `from __future__ import annotations`: DaCe evaluates the type annotations of its programs.

import numpy as np

from terastack.repro.dace.kernel import Kernel, rng

# --------------------------------------------------------------------------- spmv (CSR)


def spmv_init(M: int, N: int, nnz_per_row: int) -> dict:
    r = rng(14)
    lengths = r.integers(1, 2 * nnz_per_row, size=M)
    A_row = np.zeros(M + 1, dtype=np.int32)
    np.cumsum(lengths, out=A_row[1:])
    nnz = int(A_row[-1])
    return {"A_row": A_row, "A_col": r.integers(0, N, size=nnz).astype(np.int32), "A_val": r.random(nnz),
            "x": r.random(N)}


def spmv_numpy(A_row, A_col, A_val, x):
    # y_i = sum_{k = row[i]}^{row[i+1]-1} val[k] x[col[k]]  (rows may be empty)
    rows = np.repeat(np.arange(A_row.shape[0] - 1), np.diff(A_row))
    return np.bincount(rows, weights=A_val * x[A_col], minlength=A_row.shape[0] - 1)


def spmv_dace():
    import dace

    M, N, nnz = dace.symbol("M"), dace.symbol("N"), dace.symbol("nnz")

    def spmv(A_row: dace.int32[M + 1], A_col: dace.int32[nnz], A_val: dace.float64[nnz], x: dace.float64[N]):
        y = np.zeros(M, dtype=np.float64)
        for i in dace.map[0:M]:
            for k in range(A_row[i], A_row[i + 1]):
                y[i] += A_val[k] * x[A_col[k]]
        return y

    return spmv


def spmv_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def spmv(A_row, A_col, A_val, x):
        m = A_row.shape[0] - 1
        y = np.zeros(m)
        for i in numba.prange(m):
            s = 0.0
            for k in range(A_row[i], A_row[i + 1]):
                s += A_val[k] * x[A_col[k]]
            y[i] = s
        return y

    return spmv


SPMV = Kernel(
    name="spmv", domain="sparse", definition="y = A x, A in CSR (row pointers, column indices, values)",
    args=("A_row", "A_col", "A_val", "x"), returns=1,
    sizes={"smoke": dict(M=80000, N=80000, nnz_per_row=8), "small": dict(M=400000, N=400000, nnz_per_row=16),
           "full": dict(M=1250000, N=1250000, nnz_per_row=32)},
    init=spmv_init, numpy=spmv_numpy, dace=spmv_dace, numba=spmv_numba, rtol=1e-12, atol=1e-12,
    extras={"dace_note": "a map over rows with a data-dependent inner loop (NumPy's form uses np.repeat and "
                         "np.bincount, which DaCe does not take)"})

# --------------------------------------------------------------------------- crc16

#: CRC-16/X-25: reflected polynomial 0x1021 (0x8408 reversed), init 0xFFFF, output xor 0xFFFF.
CRC16_POLY = 0x8408


def crc16_init(N: int) -> dict:
    return {"data": rng(15).integers(0, 256, size=N, dtype=np.uint8)}


def crc16_numpy(data):
    # crc ^= byte; eight times: crc = (crc >> 1) ^ poly if crc is odd else crc >> 1; finally crc ^ 0xFFFF.
    # Each step depends on the previous one: nothing to vectorize, so NumPy runs this in the interpreter.
    crc = 0xFFFF
    for b in data.tolist():
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ CRC16_POLY if crc & 1 else crc >> 1
    return np.uint16(crc ^ 0xFFFF)


def crc16_dace():
    import dace

    N = dace.symbol("N")

    def crc16(data: dace.uint8[N]):
        crc = np.uint16(0xFFFF)
        for i in range(N):
            crc = crc ^ np.uint16(data[i])
            for _j in range(8):
                if crc & 1:
                    crc = (crc >> 1) ^ np.uint16(0x8408)
                else:
                    crc = crc >> 1
        return crc ^ np.uint16(0xFFFF)

    return crc16


def crc16_numba():
    import numba

    @numba.njit(cache=False)
    def crc16(data):
        crc = 0xFFFF
        for i in range(data.shape[0]):
            crc ^= data[i]
            for _ in range(8):
                if crc & 1:
                    crc = (crc >> 1) ^ 0x8408
                else:
                    crc >>= 1
        return np.uint16(crc ^ 0xFFFF)

    return crc16


CRC16 = Kernel(
    name="crc16", domain="bit manipulation", definition="CRC-16/X-25 (poly 0x1021 reflected, init/xorout 0xFFFF)",
    args=("data",), returns=1,
    extras={"scalar_return": True, "dace_note": "the same bit loop with explicit uint16 casts"},
    sizes={"smoke": dict(N=18000), "small": dict(N=100000), "full": dict(N=1000000)},
    init=crc16_init, numpy=crc16_numpy, dace=crc16_dace, numba=crc16_numba, rtol=0.0, atol=0.0,
    tolerance_note="integer result: must be exact")

KERNELS = [SPMV, CRC16]
