"""Each kernel's NumPy form against a tiny case worked out by hand (the reference every framework is held to)."""
import math

import numpy as np
import pytest

from terastack.repro.dace import kernels as registry
from terastack.repro.dace.kernel import Kernel, fresh_args, readonly_checksums
from terastack.repro.dace.kernels import dl, linalg, misc, physics, stencils


def test_at_least_twelve_kernels_each_with_three_frameworks_and_presets():
    assert len(registry.KERNELS) >= 12
    for k in registry.KERNELS.values():
        assert k.dace is not None and k.numba is not None, k.name
        assert set(k.sizes) == {"smoke", "small", "full"}, k.name


def test_gemm():
    C = np.eye(2)
    linalg.gemm_numpy(2.0, 3.0, C, np.array([[1.0, 2], [3, 4]]), np.array([[5.0, 6], [7, 8]]))
    # A B = [[19, 22], [43, 50]]; 2 A B + 3 I
    np.testing.assert_array_equal(C, [[41, 44], [86, 103]])


def test_atax():
    # A x = [3, 7]; A^T [3, 7] = [1*3 + 3*7, 2*3 + 4*7]
    np.testing.assert_array_equal(linalg.atax_numpy(np.array([[1.0, 2], [3, 4]]), np.ones(2)), [24, 34])


def test_bicg():
    s, q = linalg.bicg_numpy(np.array([[1.0, 2], [3, 4]]), np.array([1.0, 0]), np.array([0.0, 1]))
    np.testing.assert_array_equal(s, [3, 4])      # A^T r: second row of A
    np.testing.assert_array_equal(q, [1, 3])      # A p: first column of A


def test_mvt():
    x1, x2 = np.ones(2), np.zeros(2)
    linalg.mvt_numpy(x1, x2, np.array([1.0, 0]), np.array([0.0, 1]), np.array([[1.0, 2], [3, 4]]))
    np.testing.assert_array_equal(x1, [2, 4])     # 1 + first column
    np.testing.assert_array_equal(x2, [3, 4])     # second row


def test_gesummv():
    y = linalg.gesummv_numpy(2.0, 1.0, np.eye(2), np.ones((2, 2)), np.array([1.0, 2]))
    np.testing.assert_array_equal(y, [5, 7])      # 2 x + [3, 3]


def test_k2mm_rectangular():
    A = np.array([[1.0, 0, 0], [0, 1, 0]])            # 2x3 picks the first two rows of B
    B = np.array([[1.0, 2], [3, 4], [5, 6]])
    C = np.ones((2, 1))
    D = np.ones((2, 1))
    linalg.k2mm_numpy(2.0, 1.0, A, B, C, D)
    np.testing.assert_array_equal(D, [[7], [15]])     # 2 * [[3], [7]] + 1


def test_jacobi_1d_one_step():
    A, B = np.array([0.0, 3, 6, 0]), np.zeros(4)
    stencils.jacobi_1d_numpy(2, A, B)                 # range(1, 2): one step
    np.testing.assert_allclose(B, [0, 3, 3, 0])
    np.testing.assert_allclose(A, [0, 2, 2, 0])


def test_jacobi_2d_one_step():
    A, B = np.zeros((3, 3)), np.zeros((3, 3))
    A[1, 1] = 5
    stencils.jacobi_2d_numpy(2, A, B)
    assert B[1, 1] == pytest.approx(1.0)              # 0.2 * 5
    assert A[1, 1] == pytest.approx(0.2)              # 0.2 * B[1, 1], neighbours 0
    assert A.sum() == pytest.approx(0.2)              # the boundary never changes


def test_heat_3d_one_step():
    A, B = np.zeros((3, 3, 3)), np.zeros((3, 3, 3))
    A[1, 1, 1] = 8
    stencils.heat_3d_numpy(2, A, B)
    assert B[1, 1, 1] == pytest.approx(2.0)           # 8 + 0.125 * 3 * (-16)
    assert A[1, 1, 1] == pytest.approx(0.5)           # 2 + 0.125 * 3 * (-4)


def test_softmax():
    x = np.log(np.array([1.0, 2, 1])).reshape(1, 1, 1, 3)
    np.testing.assert_allclose(dl.softmax_numpy(x).ravel(), [0.25, 0.5, 0.25])
    big = np.array([1000.0, 1000, 1000]).reshape(1, 1, 1, 3)    # no overflow: the max is subtracted
    np.testing.assert_allclose(dl.softmax_numpy(big).ravel(), [1 / 3] * 3)


def test_conv2d_bias():
    inp = np.arange(1.0, 10).reshape(1, 3, 3, 1)
    out = dl.conv2d_numpy(inp, np.ones((2, 2, 1, 1)), np.array([10.0]))
    # 2x2 window sums 12, 16, 24, 28, plus the bias
    np.testing.assert_array_equal(out.reshape(2, 2), [[22, 26], [34, 38]])


def test_azimint_bins_and_excludes_rmax():
    radius = np.array([0.1, 0.2, 0.6, 0.9, 1.0])
    data = np.array([1.0, 3, 5, 7, 100])
    # bin 0 = [0, 0.5): mean(1, 3); bin 1 = [0.5, 1.0): mean(5, 7); r == rmax is in no bin
    np.testing.assert_allclose(physics.azimint_numpy(data, radius, 2), [2, 6])


def test_azimint_needs_power_of_two_bins():
    with pytest.raises(ValueError, match="npt"):
        physics.azimint_init(N=10, npt=12)


def test_nbody_two_bodies_one_step():
    pos = np.array([[0.0, 0, 0], [1, 0, 0]])
    vel = np.zeros((2, 3))
    # softening 1e-4 keeps the self-term finite and changes the forces by ~1e-8 relative
    physics.nbody_numpy(pos, vel, np.ones(2), 1, 0.1, 1.0, 1e-4)
    # kick (a = +-1, dv = 0.05), drift (dx = 0.005), kick at distance 0.99 (a = 1 / 0.99^2)
    assert pos[0, 0] == pytest.approx(0.005, rel=1e-6)
    assert pos[1, 0] == pytest.approx(0.995, rel=1e-6)
    assert vel[0, 0] == pytest.approx(0.05 + 0.05 / 0.99**2, rel=1e-6)
    assert vel[1, 0] == pytest.approx(-(0.05 + 0.05 / 0.99**2), rel=1e-6)
    np.testing.assert_array_equal(pos[:, 1:], 0)


def test_spmv_with_empty_row():
    # [[1, 0, 2], [0, 0, 0], [0, 3, 0]] @ [1, 2, 3]
    y = misc.spmv_numpy(np.array([0, 2, 2, 3], np.int32), np.array([0, 2, 1], np.int32), np.array([1.0, 2, 3]),
                        np.array([1.0, 2, 3]))
    np.testing.assert_array_equal(y, [7, 0, 6])


def test_spmv_init_is_valid_csr():
    a = misc.spmv_init(M=100, N=50, nnz_per_row=4)
    assert a["A_row"][0] == 0 and np.all(np.diff(a["A_row"]) >= 1) and a["A_row"][-1] == len(a["A_col"])
    assert a["A_col"].max() < 50


def test_crc16_check_value():
    # the standard check value of CRC-16/X-25 for the ASCII digits 1..9
    assert int(misc.crc16_numpy(np.frombuffer(b"123456789", np.uint8))) == 0x906E
    assert int(misc.crc16_numpy(np.zeros(0, np.uint8))) == 0x0000


@pytest.mark.parametrize("name", list(registry.KERNELS))
def test_smoke_inputs_run_and_are_deterministic(name):
    k = registry.KERNELS[name]
    a, b = k.inputs("smoke"), k.inputs("smoke")
    assert readonly_checksums(k, a) == readonly_checksums(k, b)
    out = k.call(k.numpy, fresh_args(k, a))
    assert all(np.all(np.isfinite(o)) for o in out)
    assert len(out) == len(k.outputs) + k.returns


def test_fresh_args_copies_only_outputs():
    k = registry.KERNELS["gemm"]
    inputs = k.init(NI=3, NJ=4, NK=5)
    args = fresh_args(k, inputs)
    assert args["C"] is not inputs["C"] and args["A"] is inputs["A"]


def test_kernel_config_errors_name_the_field():
    with pytest.raises(ValueError, match="outputs"):
        Kernel(name="x", domain="d", definition="", args=("a",), outputs=("b",),
               sizes={p: {} for p in ("smoke", "small", "full")}, init=dict, numpy=lambda a: a)
    with pytest.raises(ValueError, match="preset 'full' missing"):
        Kernel(name="x", domain="d", definition="", args=("a",), returns=1, sizes={"smoke": {}, "small": {}},
               init=dict, numpy=lambda a: a)
    with pytest.raises(ValueError, match="unknown kernel"):
        registry.select(["gemm", "nope"])
    assert not math.isnan(len(registry.select([])))
