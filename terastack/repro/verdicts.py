"""Turns a claim and a benchmark result (or the results of several runs) into a verdict with its reason.

Every verdict but "reproduced" carries the machine's reason in its text (a reported row too), with the run's own
figures the claim names as ``evidence``. With several runs of one benchmark (``terastack repro --repeat N``), the
verdict is that of the median value, and the reason lists every run's value and the spread.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

from terastack.repro.claims import (NOT_MEASURED, NOT_REPRODUCED, OUT_OF_SCOPE, REPORTED, REPRODUCED, Claim)

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Verdict:
    claim: Claim
    status: str
    measured: float | None
    reason: str
    #: each run's value, in run order, when the benchmark ran more than once (None: that run measured nothing)
    runs: tuple[float | None, ...] = ()

    def as_dict(self) -> dict:
        return {"claim": self.claim.id, "status": self.status, "measured": self.measured, "reason": self.reason,
                "target": self.claim.target, "comparison": self.claim.comparison,
                "paper_value": self.claim.paper_value, "runs": list(self.runs)}


def lookup(result: dict, path: str):
    """``result["a"]["b"]`` for ``"a.b"``; list elements by index; ``_MISSING`` when absent."""
    node = result
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and part.isdigit() and int(part) in node:
            node = node[int(part)]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _number(value, aggregate: str | None):
    if isinstance(value, list) and aggregate:
        nums = [float(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not nums:
            return None
        return {"max": max, "min": min, "mean": lambda v: sum(v) / len(v)}[aggregate](nums)
    if isinstance(value, bool):
        return 1.0 if value else 0.0      # a yes/no check: claims compare it "== 1"
    if not isinstance(value, (int, float)):
        return None
    return float(value)


def _meets(value: float, comparison: str, target: float) -> bool:
    if comparison == ">=":
        return value >= target
    if comparison == "<=":
        return value <= target
    return math.isclose(value, target, rel_tol=1e-9, abs_tol=1e-12)


def fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if unit == "bool":
        return "yes" if value else "no"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "fraction":
        return f"{value:.1%}"
    if unit in ("ops/s", "bytes"):
        return f"{value:,.0f}" + (f" {unit}" if unit else "")
    return f"{value:.3g}" + (f" {unit}" if unit and unit not in ("ratio",) else "")


def _measure(claim: Claim, result: dict) -> tuple[float | None, str]:
    """(value, "") from ``result`` for ``claim``, or (None, why not)."""
    older = [path for path in claim.requires if lookup(result, path) is _MISSING]
    if older:
        return None, (f"the {claim.benchmark} result has no `{'`, `'.join(older)}`: its run is from before the "
                      f"benchmark measured what this claim reads; a new run measures it.")
    raw = lookup(result, claim.field)
    if raw is _MISSING:
        keys = ", ".join(sorted(k for k in result if not isinstance(result[k], (dict, list)))[:25])
        return None, (f"field `{claim.field}` is not in the {claim.benchmark} result: the run did not measure it "
                      f"(its scalar fields: {keys}).")
    value = _number(raw, claim.aggregate)
    if value is None:
        return None, f"field `{claim.field}` is {raw!r}, not a number" + _why_none(result, claim.field)
    value *= claim.factor
    if claim.ratio_to:
        raw_denom = lookup(result, claim.ratio_to)
        denom = None if raw_denom is _MISSING else _number(raw_denom, claim.aggregate)
        if not denom:
            shown = "not in the result" if raw_denom is _MISSING else f"{raw_denom!r}, not a non-zero number"
            why = _why_none(result, claim.ratio_to) or (f" (the {claim.benchmark} benchmark's raw JSON and log say "
                                                        f"why)")
            return None, f"field `{claim.ratio_to}` is {shown}{why}"
        value = value / denom
    if isinstance(value, float) and math.isnan(value):
        return None, f"field `{claim.field}` is NaN (nothing counted)"
    return value, ""


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."


def _why_none(result: dict, field: str) -> str:
    """What the benchmark said about a field it left empty (its ``why_none`` mapping), or ""."""
    why = (result.get("why_none") or {}).get(field) if isinstance(result, dict) else None
    return f": {why}" if why else ""


def _shown(value) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "—"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)[:200]
    return str(value)


def evidence_text(claim: Claim, result: dict | None) -> str:
    """The run's own figures the claim names, as "This run: a 1.07, b 0.98." ("" when it names none)."""
    if not claim.evidence or not isinstance(result, dict):
        return ""
    parts = []
    for path in claim.evidence:
        value = lookup(result, path)
        parts.append(f"{path} {'not in the result' if value is _MISSING else _shown(value)}")
    return " This run: " + ", ".join(parts) + "."


def evaluate(claim: Claim, suite_status: str, suite_reason: str, result: dict | None,
             preset: str | None = None) -> Verdict:
    """The verdict for ``claim`` given its benchmark's result (None when it did not run) at ``preset``."""
    if claim.field is None:
        extra = f" A model answers it as a prediction: `{claim.prediction_command}`." if claim.prediction_command else ""
        return Verdict(claim, OUT_OF_SCOPE, None, claim.differs_because + "." + extra)
    if preset is not None and preset not in claim.measured_at:
        # the benchmark ran (or says why not); the claim needs a larger preset to mean anything
        ran = f"{claim.benchmark}: {suite_status}" + (f": {suite_reason}" if suite_status != "ok" and suite_reason
                                                       else "")
        if suite_status == "ok" and result is not None:
            value, _ = _measure(claim, result)
            if value is not None:
                ran += f", this run's figure {fmt(value, claim.unit)}"
        return Verdict(claim, NOT_MEASURED, None,
                       f"judged at preset {' and '.join(claim.measured_at)} only: {claim.not_measured_because} "
                       f"({ran})")
    if suite_status != "ok" or result is None:
        return Verdict(claim, NOT_MEASURED, None, f"{claim.benchmark}: {suite_status}: {suite_reason}")
    value, why = _measure(claim, result)
    if value is None:
        return Verdict(claim, NOT_MEASURED, None, _sentence(why) + evidence_text(claim, result))
    return judge(claim, value, result)


def judge(claim: Claim, value: float, result: dict | None = None) -> Verdict:
    """The verdict for a measured ``value`` of ``claim``; ``result``: the run it came from (for its evidence)."""
    evidence = evidence_text(claim, result)
    why_here = f" Why this machine differs: {_sentence(claim.differs_because)}"
    if claim.target is None:
        why = claim.target_reason or "reported for comparison"
        # the paper's figure as stated (93.16%, not the table's rounding of it to 93.2%)
        stated = f"{claim.paper_value * 100:g}%" if claim.unit == "fraction" else fmt(claim.paper_value, claim.unit)
        beside = f" (paper: {stated})" if claim.paper_value is not None else ""
        return Verdict(claim, REPORTED, value, f"no target{beside}: {_sentence(why)}{why_here}{evidence}")
    target_txt = f"{claim.comparison} {fmt(claim.target, claim.unit)}"
    if _meets(value, claim.comparison, claim.target):
        note = f"meets {target_txt}"
        if claim.paper_value is not None and claim.target != claim.paper_value:
            note += f" (paper: {fmt(claim.paper_value, claim.unit)})"
        return Verdict(claim, REPRODUCED, value, note + evidence)
    return Verdict(claim, NOT_REPRODUCED, value,
                   f"measured {fmt(value, claim.unit)}, target {target_txt}.{why_here}{evidence}")


def evaluate_runs(claim: Claim, runs: list[tuple[str, str, dict | None]], preset: str | None = None) -> Verdict:
    """The verdict for ``claim`` over several runs of its benchmark, each (status, reason, result): the median
    run's value judged, every run's value and the spread in the reason. One run is :func:`evaluate`'s verdict."""
    if len(runs) < 2 or claim.field is None:
        return evaluate(claim, *(runs[0] if runs else ("missing", "no run", None)), preset)
    each = [evaluate(claim, status, reason, result, preset) for status, reason, result in runs]
    results = [result for _, _, result in runs]
    values = [v.measured for v in each]
    measured = [(v, r) for v, r in zip(values, results) if v is not None]
    if not measured:
        first = each[0]
        return Verdict(claim, first.status, None, f"{first.reason} (in each of {len(results)} runs)", tuple(values))
    median = statistics.median(v for v, _ in measured)
    # the evidence of the run whose value is nearest the median
    nearest = min(measured, key=lambda vr: abs(vr[0] - median))[1]
    verdict = judge(claim, median, nearest)
    shown = ", ".join(fmt(v, claim.unit) for v in values)
    low, high = min(v for v, _ in measured), max(v for v, _ in measured)
    spread = (f"Runs: {shown}; median {fmt(median, claim.unit)}, spread {fmt(low, claim.unit)} to "
              f"{fmt(high, claim.unit)}" + (f" ({len(measured)} of {len(values)} runs measured it)"
                                            if len(measured) < len(values) else "") + ". ")
    return Verdict(claim, verdict.status, median, spread + verdict.reason, tuple(values))
