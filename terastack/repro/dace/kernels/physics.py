"""Physics kernels: naive azimuthal integration and gravitational N-body (leapfrog)."""
# No `from __future__ import annotations`: DaCe evaluates the type annotations of its programs.

import numpy as np

from terastack.repro.dace.kernel import Kernel, annotated, rng

# --------------------------------------------------------------------------- azimint (naive)


def azimint_init(N: int, npt: int) -> dict:
    # [Note: azimint bin edges]
    # Bin i holds the points with rmax*i/npt <= r < rmax*(i+1)/npt, so the
    # point at r == rmax falls outside every bin by definition. Compilers
    # may evaluate an edge as (rmax*i)/npt or rmax*(i/npt) (fast-math); with
    # npt a power of two both are exact, so every framework bins every point
    # identically and the comparison is about arithmetic, not edge rounding.
    if npt & (npt - 1):
        raise ValueError(f"azimint: npt: must be a power of two (see [Note: azimint bin edges]), got {npt}")
    r = rng(12)
    return {"data": r.random(N), "radius": r.random(N), "npt": npt}


def azimint_numpy(data, radius, npt):
    # res[i] = mean of data over the points whose radius falls in bin i
    rmax = radius.max()
    res = np.zeros(npt, dtype=np.float64)
    for i in range(npt):
        r1 = rmax * i / npt
        r2 = rmax * (i + 1) / npt
        mask = np.logical_and(r1 <= radius, radius < r2)
        res[i] = np.sum(np.where(mask, data, 0.0)) / np.sum(mask)
    return res


def azimint_dace():
    import dace

    N, npt = dace.symbol("N"), dace.symbol("npt")

    def azimint(data: dace.float64[N], radius: dace.float64[N]):
        rmax = np.max(radius)
        res = np.zeros(npt, dtype=np.float64)
        for i in range(npt):
            r1 = rmax * i / npt
            r2 = rmax * (i + 1) / npt
            mask = np.logical_and(r1 <= radius, radius < r2)
            # DaCe reduces a boolean array with logical-or semantics: count it as float64 instead.
            res[i] = np.sum(np.where(mask, data, 0.0)) / np.sum(mask.astype(np.float64))
        return res

    # npt is a symbol (an array size) in DaCe, passed by keyword in the runner.
    return azimint


def azimint_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def azimint(data, radius, npt):
        rmax = radius.max()
        res = np.zeros(npt, dtype=np.float64)
        for i in numba.prange(npt):
            r1 = rmax * i / npt
            r2 = rmax * (i + 1) / npt
            s = 0.0
            c = 0
            for k in range(data.shape[0]):
                if r1 <= radius[k] and radius[k] < r2:
                    s += data[k]
                    c += 1
            res[i] = s / c
        return res

    return azimint


AZIMINT = Kernel(
    name="azimint", domain="physics", definition="res_i = mean{ data_k : rmax i/npt <= r_k < rmax (i+1)/npt }",
    args=("data", "radius", "npt"), returns=1,
    sizes={"smoke": dict(N=27000, npt=64), "small": dict(N=205000, npt=256), "full": dict(N=1000000, npt=512)},
    init=azimint_init, numpy=azimint_numpy, dace=azimint_dace, numba=azimint_numba,
    rtol=1e-9, atol=1e-12, tolerance_note="per-bin sums of ~N/npt terms in different orders",
    extras={"dace_symbols": ("npt",),
            "dace_note": "npt is a DaCe symbol; the bin count is summed as float64 (DaCe reduces a boolean "
                         "array with logical-or semantics, giving 1)"})

# --------------------------------------------------------------------------- nbody


def nbody_init(N: int, steps: int) -> dict:
    r = rng(13)
    mass = 20.0 * np.ones(N) / N
    pos = r.standard_normal((N, 3))
    vel = r.standard_normal((N, 3))
    vel -= np.mean(mass[:, None] * vel, axis=0) / np.mean(mass)   # centre-of-mass frame
    return {"pos": pos, "vel": vel, "mass": mass, "steps": steps, "dt": 0.01, "G": 1.0, "soft": 0.1}


def nbody_numpy(pos, vel, mass, steps, dt, G, soft):
    # a_i = G sum_j m_j (r_j - r_i) / (|r_j - r_i|^2 + soft^2)^(3/2); kick-drift-kick leapfrog
    for _s in range(steps):
        for half in range(2):
            x, y, z = pos[:, 0], pos[:, 1], pos[:, 2]
            # Pairwise differences by broadcasting a row against a column. (Written as x.T - x on
            # (N, 1) slices of pos, DaCe 1.0.2 computes them wrongly: found by this suite's validation.)
            dx = x[np.newaxis, :] - x[:, np.newaxis]
            dy = y[np.newaxis, :] - y[:, np.newaxis]
            dz = z[np.newaxis, :] - z[:, np.newaxis]
            inv_r3 = (dx ** 2 + dy ** 2 + dz ** 2 + soft ** 2) ** (-1.5)
            ax = G * (dx * inv_r3) @ mass
            ay = G * (dy * inv_r3) @ mass
            az = G * (dz * inv_r3) @ mass
            vel[:, 0] += ax * dt / 2.0
            vel[:, 1] += ay * dt / 2.0
            vel[:, 2] += az * dt / 2.0
            if half == 0:
                pos += vel * dt


def nbody_dace():
    import dace

    N = dace.symbol("N")
    return annotated(nbody_numpy, pos=dace.float64[N, 3], vel=dace.float64[N, 3], mass=dace.float64[N],
                     steps=dace.int64, dt=dace.float64, G=dace.float64, soft=dace.float64)


def nbody_numba():
    import numba

    @numba.njit(parallel=True, cache=False)
    def _accel(pos, mass, G, soft, acc):
        n = pos.shape[0]
        for i in numba.prange(n):
            a0 = a1 = a2 = 0.0
            for j in range(n):
                dx = pos[j, 0] - pos[i, 0]
                dy = pos[j, 1] - pos[i, 1]
                dz = pos[j, 2] - pos[i, 2]
                inv_r3 = (dx * dx + dy * dy + dz * dz + soft * soft) ** (-1.5)
                a0 += dx * inv_r3 * mass[j]
                a1 += dy * inv_r3 * mass[j]
                a2 += dz * inv_r3 * mass[j]
            acc[i, 0], acc[i, 1], acc[i, 2] = G * a0, G * a1, G * a2

    @numba.njit(cache=False)
    def nbody(pos, vel, mass, steps, dt, G, soft):
        acc = np.empty_like(pos)
        for _s in range(steps):
            for half in range(2):
                _accel(pos, mass, G, soft, acc)
                vel += acc * dt / 2.0
                if half == 0:
                    pos += vel * dt

    return nbody


NBODY = Kernel(
    name="nbody", domain="physics", definition="a_i = G sum_j m_j (r_j - r_i) / (|r_j - r_i|^2 + eps^2)^{3/2}; leapfrog",
    args=("pos", "vel", "mass", "steps", "dt", "G", "soft"), outputs=("pos", "vel"),
    sizes={"smoke": dict(N=300, steps=3), "small": dict(N=800, steps=4), "full": dict(N=2000, steps=6)},
    init=nbody_init, numpy=nbody_numpy, dace=nbody_dace, numba=nbody_numba,
    extras={"dace_note": "pairwise differences written x[np.newaxis, :] - x[:, np.newaxis]; as x.T - x on (N, 1) "
                         "slices DaCe 1.0.2 computes them wrongly"},
    rtol=1e-8, atol=1e-10, tolerance_note="pairwise sums in different orders, amplified over the time steps")

KERNELS = [AZIMINT, NBODY]
