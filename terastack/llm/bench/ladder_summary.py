"""What ``terastack bench llm-scale``'s ladder adds up to: each system's largest model, how its ladder ended, and
the ratios of every rung's rows (:mod:`terastack.llm.bench.bench_scale` runs the rungs)."""
from __future__ import annotations


def entry_name(system: str, optimizer: str) -> str:
    """A row's system as its ratios and headline name it: terastack with a format other than AdamW is
    ``terastack_<format>``."""
    return system if optimizer == "adamw" else f"{system}_{optimizer}"


def ladder_end(rows: list[dict], system: str) -> tuple[dict | None, str]:
    """(the row of the largest model ``system`` trained, or None when the ladder does not measure it; how its
    ladder ended). Only a ladder that ended for memory, or went through every rung, measures its largest model: a
    rung that failed for another reason (a configuration error, a timeout, a disk too small) leaves it unknown
    ([Note: ZeRO-Infinity configured for the model] in terastack.llm.bench.zero_infinity)."""
    mine = [r for r in rows if r["system"] == system and r["optimizer"] == "adamw"]
    if not mine:
        return None, "not run"
    fit = [r for r in mine if r["fits"]]
    end = next((r for r in mine if not r["fits"]), None)
    if end is None:
        return fit[-1], f"trained every rung, up to {fit[-1]['size']} ({fit[-1]['params'] / 1e9:.2f}B)"
    where = f"{end['size']} ({end['params'] / 1e9:.2f}B)"
    if end["fits"] is False:
        last = f"; its largest, {fit[-1]['size']}" if fit else "; it trained no rung"
        return (fit[-1] if fit else None), f"does not fit at {where}: {end['reason']}{last}"
    return None, (f"stopped at {where}, not for memory: {end['reason']}; its largest model is not measured")


def summarize(result: dict, systems: tuple[str, ...]) -> None:
    """The ladder's figures from its rows: each system's largest model, how its ladder ended, the ratios."""
    rows = result["rows"]
    why_none = result.setdefault("why_none", {})
    for system in systems:
        top, how = ladder_end(rows, system)
        result[f"ladder_end_{system}"] = how
        result[f"max_params_{system}"] = top["params"] if top else None
        result[f"max_params_peak_rss_bytes_{system}"] = top["peak_rss_bytes"] if top else None
        if top is None:
            why_none[f"max_params_{system}"] = f"{system}'s ladder {how}"
        if system == "terastack" and top is not None and top.get("state_bytes_per_param"):
            # the state the largest model keeps, at the bytes per parameter its optimizer format keeps
            result["state_bytes_per_param_terastack"] = top["state_bytes_per_param"]
            result["max_state_bytes_terastack"] = top["params"] * top["state_bytes_per_param"]
    for optimizer in result.get("optimizers", ()):
        if optimizer != "adamw":
            fit = [r["params"] for r in rows if r["system"] == "terastack" and r["optimizer"] == optimizer
                   and r["fits"]]
            result[f"max_params_terastack_{optimizer}"] = max(fit) if fit else None
    ratios = {}
    for label in result["sizes"]:
        by = {entry_name(r["system"], r["optimizer"]): r for r in rows if r["size"] == label and r["fits"]}
        base = (by.get("terastack") or {}).get("bytes_per_parameter_per_step")
        for system, ts in by.items():
            mine = ts.get("bytes_per_parameter_per_step")
            if base and mine and system.startswith("terastack_") and base["read"] + base["written"] > 0:
                # a format's bytes against AdamW's, read and written together
                ratios[f"{label}_{system}_bytes_vs_adamw"] = ((mine["read"] + mine["written"])
                                                              / (base["read"] + base["written"]))
        ref = by.get("in_memory")
        if ref is None:
            continue
        for system in by:
            if system != "in_memory":
                ratios[f"{label}_{system}_step_vs_in_memory"] = by[system]["step_s"] / ref["step_s"]
                ratios[f"{label}_{system}_rss_vs_in_memory"] = by[system]["peak_rss_bytes"] / ref["peak_rss_bytes"]
                ratios[f"{label}_{system}_tokens_per_s_vs_in_memory"] = (by[system]["tokens_per_s"]
                                                                       / ref["tokens_per_s"])
        for system, ts in by.items():
            if ts["system"] == "terastack" and ts.get("io_floor_s") is not None:
                # the floor: no schedule beats the slower of in-memory compute and the step's own bytes on the disk
                ts["floor_s"] = max(ref["step_s"], ts["io_floor_s"])
                ratios[f"{label}_{system}_step_vs_floor"] = ts["step_s"] / ts["floor_s"]
    result["ratios_vs_in_memory"] = ratios
    result.update(ratios)  # printed as scalar lines
