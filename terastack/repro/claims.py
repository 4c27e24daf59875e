"""Every claim the reproduction report checks: what the paper (or terastack itself) says, and which result field tests it.

The tables are data, one module per part of terastack (:mod:`terastack.repro.claims_storage`,
:mod:`~terastack.repro.claims_ratel`, :mod:`~terastack.repro.claims_hyperion`,
:mod:`~terastack.repro.claims_disdp`, :mod:`~terastack.repro.claims_dace`): to check a new figure, add a row
(:class:`terastack.repro.claim.Claim` says what a row holds; :mod:`terastack.repro.papers` where each quoted
abstract was read). A row names the benchmark whose JSON result holds the measurement (a dotted path into it, a
ratio of two paths, or an aggregate over a list), the comparison and the target, where a reader finds the claim,
and why this machine may differ.

Scale claims need sizes a smoke run cannot afford (a model several times what memory holds, a graph
larger than RAM): ``measured_at`` names the presets that judge them, and ``not_measured_because`` says
why the others do not. Their benchmarks still run at every preset, so a smoke run shows they work.
"""
from __future__ import annotations

from terastack.repro.claim import (NOT_MEASURED, NOT_REPRODUCED, OUT_OF_SCOPE, PRESETS, REPORTED, REPRODUCED,
                                   VERDICTS, Claim)
from terastack.repro.claims_dace import DACE_CLAIMS
from terastack.repro.claims_disdp import DISDP_CLAIMS
from terastack.repro.claims_hyperion import HYPERION_CLAIMS
from terastack.repro.claims_ratel import RATEL_CLAIMS
from terastack.repro.claims_storage import STORAGE_CLAIMS
from terastack.repro.papers import PAPERS, SEED_TEXTS, Paper

__all__ = ["CLAIMS", "NOT_MEASURED", "NOT_REPRODUCED", "OUT_OF_SCOPE", "PAPERS", "PRESETS", "REPORTED",
           "REPRODUCED", "SEED_TEXTS", "VERDICTS", "Claim", "Paper"]

#: every row, in the report's order within each suite
CLAIMS: tuple[Claim, ...] = (*STORAGE_CLAIMS, *RATEL_CLAIMS, *HYPERION_CLAIMS, *DISDP_CLAIMS, *DACE_CLAIMS)


def _check_unique() -> None:
    seen: set[str] = set()
    for claim in CLAIMS:
        if claim.id in seen:
            raise ValueError(f"claim {claim.id}: id: given to two rows")
        seen.add(claim.id)


_check_unique()
