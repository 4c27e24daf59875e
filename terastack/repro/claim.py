"""One row of the claims table (:mod:`terastack.repro.claims`): what is claimed, where it is stated, how it is judged.

Where a claim comes from (every row says, so that a reader can look it up):
- ``source="paper"``: a published figure. ``paper`` names one of :data:`terastack.repro.papers.PAPERS` and
  ``where`` the place in it the figure is stated; ``paper_figure`` quotes it in the paper's own words, its
  baseline included. ``target_reason`` says how the row is judged: why its target is what it is (terastack's
  own, or the paper's figure in a form this machine can check), or why it is only reported beside the paper's
  figure (a figure the paper gives as "up to" is never a floor without a reason). ``derived`` says how a
  ``paper_value`` the paper does not state was worked out from what it does state.
- ``source="project"``: a target terastack set itself; ``paper_figure`` states the target and ``rationale``
  the reason it was set. Such rows show as "terastack's target" in the report.

A baseline that terastack measures in place of the paper's (synchronous I/O, FSDP2, ZeRO-Infinity) is named
as terastack's, with ``baseline_reason`` saying why it stands in.
"""
from __future__ import annotations

from dataclasses import dataclass

from terastack.repro.papers import PAPERS

#: verdicts, in the order the summary counts them
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
REPORTED = "reported"
NOT_MEASURED = "not measured"
OUT_OF_SCOPE = "needs other hardware"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, REPORTED, NOT_MEASURED, OUT_OF_SCOPE)
PRESETS = ("smoke", "small", "full")

#: texts several claim tables share
GPU_NVME = "a GPU server with NVMe SSDs (the paper's testbed)"
HERE_2CORE = ("this machine has 2 CPU cores and one virtual disk; compute is the CPU, "
              "so ratios that depend on a GPU's speed relative to the SSD differ")
SMOKE_SCALE = ("preset smoke runs the benchmark at a tiny size to show it works end to end; a model or graph "
               "that small fits in memory, so there is no scale to judge")


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    id: str
    #: harness suite that measures it (io, kernels, llm, gnn, dist, scale, dace)
    suite: str
    #: benchmark inside the suite whose result holds the field (a bench name, or "dace")
    benchmark: str
    title: str
    #: "paper" (a published figure: ``paper`` and ``where`` say which) or "project" (terastack's own target:
    #: ``rationale`` says why it was set)
    source: str
    #: the paper's words or terastack's target, quoted
    paper_figure: str
    #: with source "paper": a key of PAPERS
    paper: str = ""
    #: with source "paper": where in the paper the figure is stated
    where: str = ""
    #: other works of PAPERS the row's text quotes or cites (listed in the report's sources)
    related: tuple[str, ...] = ()
    #: with source "project": why terastack set this target
    rationale: str = ""
    #: with source "paper" and a field: why the target is what it is, or why the row is reported only
    target_reason: str = ""
    #: how terastack worked out ``paper_value`` where the paper does not state it ("" when it does)
    derived: str = ""
    #: what a reproduction of the paper reran for this claim ("" when none is cited)
    reproduction: str = ""
    paper_value: float | None = None
    paper_hardware: str = ""
    #: dotted path into the result (None: this machine cannot measure it, see ``differs_because``)
    field: str | None = None
    #: the value is field * factor (then / ratio_to when set); factor turns a count into bytes, say
    factor: float = 1.0
    #: the value is field / ratio_to when set
    ratio_to: str | None = None
    #: how a list-valued field is reduced: "max", "min" or "mean"
    aggregate: str | None = None
    baseline: str = ""
    #: why terastack measures ``baseline`` in place of the paper's ("" when it is the paper's own)
    baseline_reason: str = ""
    #: comparison against ``target``: ">=", "<=" or "=="; target None: reported, no verdict
    comparison: str = ">="
    target: float | None = None
    unit: str = "x"
    #: why a figure on this machine may differ from the paper's (shown when it does)
    differs_because: str = ""
    #: the command that answers it as a labelled model prediction, when the hardware is absent here
    prediction_command: str | None = None
    #: the presets whose runs judge it (the benchmark runs at every preset regardless)
    measured_at: tuple[str, ...] = PRESETS
    #: why the other presets do not judge it
    not_measured_because: str = ""
    #: result fields (dotted paths) whose values this run's verdict prints beside its reason: the run's own figures
    #: that say which of ``differs_because``'s explanations holds for it
    evidence: tuple[str, ...] = ()
    #: result fields a run must have written for ``field`` to mean what the claim says: a run from before the
    #: benchmark wrote them measured something else, and its figure is not judged
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.comparison not in (">=", "<=", "=="):
            raise ValueError(f"claim {self.id}: comparison: must be '>=', '<=' or '==', got {self.comparison!r}")
        if self.aggregate not in (None, "max", "min", "mean"):
            raise ValueError(f"claim {self.id}: aggregate: must be max, min, mean or None")
        if self.source == "paper":
            if self.paper not in PAPERS:
                raise ValueError(f"claim {self.id}: paper: must be one of {', '.join(PAPERS)}, got {self.paper!r}")
            if not self.where:
                raise ValueError(f"claim {self.id}: where: say where in {self.paper} the figure is stated")
            if self.field is not None and not self.target_reason:
                raise ValueError(f"claim {self.id}: target_reason: say why the target is what it is, or why the "
                                 f"row is reported only")
        elif self.source == "project":
            if not self.rationale:
                raise ValueError(f"claim {self.id}: rationale: say why terastack set this target")
        else:
            raise ValueError(f"claim {self.id}: source: must be 'paper' or 'project'")
        unknown_related = [k for k in self.related if k not in PAPERS]
        if unknown_related:
            raise ValueError(f"claim {self.id}: related: not in PAPERS: {', '.join(unknown_related)}")
        if self.field is None and not self.differs_because:
            raise ValueError(f"claim {self.id}: differs_because: a claim not measured here must say why")
        if self.target is not None and not self.differs_because:
            raise ValueError(f"claim {self.id}: differs_because: a claim judged against a target must say why a "
                             "machine could miss it (its report prints the reason beside a miss)")
        unknown = [p for p in self.measured_at if p not in PRESETS]
        if unknown or not self.measured_at:
            raise ValueError(f"claim {self.id}: measured_at: presets from {PRESETS}, got {self.measured_at!r}")
        if set(self.measured_at) != set(PRESETS) and not self.not_measured_because:
            raise ValueError(f"claim {self.id}: not_measured_because: say why presets other than "
                             f"{', '.join(self.measured_at)} do not judge it")

    def source_text(self) -> str:
        """Where the claim comes from and how it is judged, as the report's table shows it."""
        if self.source != "paper":
            return f"terastack's target: {self.paper_figure} ({self.rationale})"
        text = f"{PAPERS[self.paper].short}, {self.where}: {self.paper_figure}"
        if self.derived:
            text += f" [derived by terastack: {self.derived}]"
        if self.reproduction:
            text += f" [reproduced: {self.reproduction}]"
        if self.target_reason:
            text += f" — judged here: {self.target_reason}"
        return text

    def baseline_text(self) -> str:
        """The baseline as the report's table shows it: a substitute is named as terastack's, with its reason."""
        if self.baseline_reason:
            return f"{self.baseline} (terastack's baseline: {self.baseline_reason})"
        return self.baseline
