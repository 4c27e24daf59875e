"""PNG figures for the report (matplotlib, Agg backend). Each function returns the file it wrote, or None.

matplotlib is the ``repro`` extra; without it the report says that the plots
were not drawn and why.
"""
from __future__ import annotations

import math
from pathlib import Path

from terastack.repro.claims import NOT_REPRODUCED, REPORTED, REPRODUCED

COLORS = {REPRODUCED: "#2e7d32", NOT_REPRODUCED: "#c62828", REPORTED: "#1565c0"}


def matplotlib_missing() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); install it with: pip install 'terastack[repro]'"
    return None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def claims_chart(verdicts: list[dict], path: Path) -> Path | None:
    """Measured value over target for every claim with both (1.0 = target met exactly)."""
    rows = []
    for v in verdicts:
        if v["measured"] is None or not v["target"]:
            continue
        # for "<=" claims, target/measured, so that > 1 always means "better than the target"
        score = v["measured"] / v["target"] if v["comparison"] == ">=" else (
            v["target"] / v["measured"] if v["measured"] else math.inf)
        if v["comparison"] == "==":
            continue
        rows.append((v["claim"], min(score, 10.0), v["status"]))
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    names = [r[0] for r in rows][::-1]
    ax.barh(names, [r[1] for r in rows][::-1], color=[COLORS.get(r[2], "#777") for r in rows][::-1])
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("measured / target  (for '<=' targets: target / measured); > 1 meets the target")
    ax.set_title("Claims on this machine")
    return _save(fig, path)


def _grouped_bars(ax, names: list[str], series: dict[str, list]) -> None:
    """One bar group per name, one bar per series; a value is (height, err_low, err_high) or None."""
    width = 0.8 / max(len(series), 1)
    for j, (label, values) in enumerate(series.items()):
        pts = [(i, v) for i, v in enumerate(values) if v is not None]
        ax.bar([i + (j - (len(series) - 1) / 2) * width for i, _ in pts], [v[0] for _, v in pts], width,
               yerr=[[v[1] for _, v in pts], [v[2] for _, v in pts]], capsize=2, label=label)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")


def dace_heatmap(speedups: dict, path: Path) -> Path | None:
    """Kernels x frameworks, speedup over NumPy (log colour scale); invalid or failed cells marked."""
    per_kernel = speedups.get("per_kernel") or {}
    if not per_kernel:
        return None
    frameworks = sorted({fw for row in per_kernel.values() for fw in row})
    kernels = list(per_kernel)
    import numpy as np

    grid = np.full((len(kernels), len(frameworks)), np.nan)
    for i, k in enumerate(kernels):
        for j, fw in enumerate(frameworks):
            cell = per_kernel[k].get(fw, {})
            if cell.get("status") == "ok":
                grid[i, j] = math.log10(cell["ratio"])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(frameworks), 0.42 * len(kernels) + 1.4))
    lim = max(1.0, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0)
    im = ax.imshow(grid, cmap="RdYlGn", vmin=-lim, vmax=lim, aspect="auto")
    for i, k in enumerate(kernels):
        for j, fw in enumerate(frameworks):
            cell = per_kernel[k].get(fw, {})
            text = f"{cell['ratio']:.3g}x" if cell.get("status") == "ok" else cell.get("status", "—")
            ax.text(j, i, text, ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(frameworks)), frameworks)
    ax.set_yticks(range(len(kernels)), kernels)
    fig.colorbar(im, ax=ax, label="log10 speedup over NumPy")
    ax.set_title("Speedup over NumPy (median)")
    return _save(fig, path)


def dace_bars(speedups: dict, path: Path) -> Path | None:
    """Speedup over NumPy per kernel with the bootstrap CI as error bars (log scale)."""
    per_kernel = speedups.get("per_kernel") or {}
    frameworks = sorted({fw for row in per_kernel.values() for fw in row})
    if not per_kernel or not frameworks:
        return None
    plt = _plt()
    kernels = list(per_kernel)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(kernels) + 2), 4))
    series = {}
    for fw in frameworks:
        cells = [per_kernel[k].get(fw, {}) for k in kernels]
        series[fw] = [(c["ratio"], c["ratio"] - c["ci_low"], c["ci_high"] - c["ratio"]) if c.get("status") == "ok"
                      else None for c in cells]
    _grouped_bars(ax, kernels, series)
    ax.axhline(1.0, color="black", lw=1)
    ax.set_yscale("log")
    ax.set_ylabel("speedup over NumPy (95% CI)")
    ax.legend()
    return _save(fig, path)


def dace_compile(kernels: dict, path: Path) -> Path | None:
    """First-call (compile) time per kernel and framework."""
    rows = kernels.get("kernels") or {}
    frameworks = [fw for fw in ("dace", "numba") if any(fw in e.get("frameworks", {}) for e in rows.values())]
    if not rows or not frameworks:
        return None
    plt = _plt()
    names = list(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(names) + 2), 3.8))
    _grouped_bars(ax, names, {fw: [(rows[k]["frameworks"].get(fw, {}).get("first_call_s") or 0.0, 0.0, 0.0)
                                   for k in names] for fw in frameworks})
    ax.set_ylabel("first call (compile + one run), s")
    ax.legend()
    return _save(fig, path)


def dace_scaling(efficiency: dict, path: Path) -> Path | None:
    """Efficiency against process count, strong and weak, one line per kernel."""
    if not efficiency:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, mode in zip(axes, ("strong", "weak")):
        for kernel, modes in efficiency.items():
            pts = [p for p in modes.get(mode, []) if p.get("efficiency") is not None]
            if pts:
                ax.plot([p["procs"] for p in pts], [p["efficiency"] for p in pts], marker="o", label=kernel)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_title(f"{mode} scaling")
        ax.set_xlabel("MPI processes")
        ax.set_xscale("log", base=2)
        counts = sorted({p["procs"] for modes in efficiency.values() for p in modes.get(mode, [])})
        ax.set_xticks(counts, [str(c) for c in counts])
    axes[0].set_ylabel("parallel efficiency")
    axes[1].legend()
    return _save(fig, path)
