"""The LLM planner: where each tensor rests and what each layer does with its activations.

Inputs are a :class:`ModelProfile` (per streamed unit: parameters, FLOPs,
saved-activation bytes, optionally measured compute times; built by
``terastack.llm.engine.profile``), a :class:`~terastack.plan.hardware.Hardware` and
the device and host budgets. The output is an :class:`LLMPlan`: an activation
policy per unit, a home (host or SSD) per training-state tensor, the ledger
capacities the engine runs under, and a :class:`StepPrediction`.

[Note: planning gradient accumulation]
With ``grad_accum`` N > 1 one step is N forwards and backwards and one AdamW
update. The plan is made for that step: compute, activation traffic and
compute-weight reads are N times those of one micro-batch (so a weight's
bytes per byte held grow with N when homes are chosen), the optimizer's work
is once. Each trainable tensor gets a gradient sum (4 bytes per parameter,
in optimizer chunks) that lives from the first micro-batch's backward to the
last one's; sums compete with the rest of the state for host room by bytes
moved per byte held (on the SSD a sum is written N-1 times and read N-1
times), and two chunk-sized host buffers are kept for the sums on the SSD
(one being added to, one on its way back). The gradient pool is that of one
micro-batch: a micro-batch's gradient leaves the pool as soon as it is in
its sum. See terastack.llm's [Note: gradient accumulation].
That is the horizontal order; the vertical one is planned as one pass of a
profile N times as wide, without sums, and ``grouped-G`` as ceil(N / G) passes
of a profile G times as wide, with sums between the passes (N above is then
the passes: [Note: vertical and horizontal accumulation] in
terastack.plan.accumulation_specs; ``_passes``).

[Note: choosing the activation policy]
Decoder layers are identical, so a policy is a count per option: ``n_ssd``
layers swap their saved activations to the SSD, ``n_host`` to host memory,
``n_rec`` keep only their input and recompute, the rest keep everything on the
device. Every split is scored by the step-time model under the device and host
budgets and the fastest feasible one wins ([Note: ties go to the fewest bytes]). Layers
that run first in forward swap first (their activations have the longest
time to travel and return); the last layers keep theirs (backward needs them
first). Units outside the decoder stack (embeddings, final norm, head) save
little and keep. Which policies the search counts, in which order, and what
each holds and moves: their specs (terastack.plan.activation_specs).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from terastack.allocator import device_held_bytes
from terastack.plan.accumulation_specs import AUTO as AUTO_ACCUMULATION, AccumulationSpec, accumulation_spec, candidates
from terastack.plan.activation_specs import ACTIVATIONS, AUTO, DEFAULT, layer_counts, searched
from terastack.plan.hardware import Hardware
from terastack.plan.llm_plan import STEP_TIES, LLMPlan, PlanError, StepPrediction, candidate_rank
from terastack.plan.llm_profile import ModelProfile, data_bytes, held_bytes
from terastack.plan.optimizer_formats import ADAMW, optimizer_format
from terastack.plan.optimizer_sizes import OptimizerSizes, exposed_state_io_s, masters_reread, size_candidates
from terastack.plan.staging import staging_cap
from terastack.plan.state_homes import Homes, StateHomes
from terastack.plan.step_time import StepTimeModel
from terastack.plan.schedule_specs import EAGER, ExecutorKind, ScheduleSpec, schedule_spec
from terastack.units import format_bytes, parse_bytes

@dataclass(frozen=True, kw_only=True, slots=True)
class _Shortfall:
    """Why a candidate does not fit: the budget it overruns, by how much, and what it would hold."""

    budget: str          # "device" or "host"
    needed: int          # bytes the candidate needs in that budget
    available: int
    limit: int
    what: object         # what the needed bytes are made of (for the error message; or a function making it)

    @property
    def shortfall(self) -> int:
        return self.needed - self.available

    def error(self) -> PlanError:
        return PlanError(self.budget, needed=self.needed, available=self.available, limit=self.limit,
                         what=self.what() if callable(self.what) else self.what)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Split:
    """What a set of activation policies adds up to (the planner's search works on these sums)."""

    on_device: int       # activations kept on the device (of recomputed units: their inputs)
    host_acts: int       # activations swapped to host memory
    ssd_acts: int        # activations swapped to the SSD
    max_swapped: int     # the largest swapped unit (in flight out and back at once)
    recompute_s: float   # the second forward of recomputed units
    policies: tuple = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class _Scored:
    """A candidate that fits both budgets: its predicted step and what its plan is built from."""

    prediction: StepPrediction
    homes: Homes
    sizes: OptimizerSizes
    retained_units: tuple  # Retention.units


class _Remembered:
    """What the planners of one search remember of the profile they plan (:meth:`LLMPlanner.for_config` shares
    it, so a result one of them computes later serves the others too)."""

    __slots__ = ("profile", "hw", "cache", "homes_profile", "homes_cache")

    def __init__(self):
        self.profile = self.hw = self.homes_profile = None
        self.cache: dict = {}
        self.homes_cache: dict = {}


class LLMPlanner(StateHomes, StepTimeModel):
    """Chooses activation policies and state homes that minimize the predicted step time."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        device_budget: int | str
        host_budget: int | str
        #: AUTO (search), one registered policy name for every decoder layer, a comma-separated cycle of them over
        #: the decoder layers ("keep,ssd"), or a tuple with one policy per unit (terastack.plan.activation_specs)
        policy: str | tuple = AUTO
        #: the optimizer schedule's name (terastack.plan.schedule_specs)
        optimizer_schedule: str = EAGER.name
        prefetch_depth: int = 1
        #: fraction of the peak matmul rate reached by training (used when units have no measured times)
        compute_efficiency: float = 0.5
        #: "auto": state goes to host memory while it fits; "ssd": everything rests on the SSD
        state_placement: str = "auto"
        #: elements per optimizer chunk (the optimizer reads and writes its state in chunks of this size)
        optimizer_chunk: int = 1 << 20
        #: the optimizer state format ([Note: optimizer state formats] in terastack.plan.optimizer_formats)
        optimizer: str = ADAMW.name
        #: keep updated fp32 masters of the first units in the device tier for the next forward (when they fit)
        retain_weights: bool = True
        #: eager updates run on the training thread, a unit's state at a time (see the optimizer's
        #: [Note: inline updates without an accelerator]); False: on the optimizer thread, a chunk at a time
        inline_updates: bool = False
        #: micro-batches per optimizer step (gradient accumulation); see [Note: planning gradient accumulation]
        grad_accum: int = 1
        #: with an accelerator, frozen weights stay in the device tier when they all fit beside the step's working
        #: memory (see [Note: frozen weights on the device]); False: they stream in like the others
        frozen_on_device: bool = True
        #: the order of the micro-batches: AUTO (the fewest passes that fit) or an order's name;
        #: see [Note: vertical and horizontal accumulation] (terastack.plan.accumulation_specs)
        accumulation: str = AUTO_ACCUMULATION
        #: steps predicted within this share of the fastest tie ([Note: ties go to the fewest bytes]); 0: none
        step_ties: float = STEP_TIES
        #: under this step (s) candidates rank by bytes moved (set by a search that found the fastest itself)
        step_ceiling: float | None = None

        def __post_init__(self) -> None:
            if isinstance(self.grad_accum, bool) or not isinstance(self.grad_accum, int) or self.grad_accum < 1:
                raise ValueError(f"grad_accum: must be an integer >= 1, got {self.grad_accum!r}")
            self.device_budget = parse_bytes(self.device_budget, field="device_budget")
            self.host_budget = parse_bytes(self.host_budget, field="host_budget")
            if isinstance(self.policy, str):
                bad = [p for p in self.policy.split(",") if p not in ACTIVATIONS]
                if self.policy != AUTO and bad:
                    raise ValueError(f"policy: must be {AUTO}, one of {', '.join(ACTIVATIONS)}, or a comma-separated "
                                     f"cycle of them over the decoder layers; got {self.policy!r}")
            else:
                self.policy = tuple(self.policy)
                bad = [p for p in self.policy if p not in ACTIVATIONS]
                if bad:
                    raise ValueError(f"policy: unknown per-unit policies {bad}; choose from {', '.join(ACTIVATIONS)}")
            schedule_spec(self.optimizer_schedule)  # the one check of a schedule's name
            if self.accumulation != AUTO_ACCUMULATION:
                accumulation_spec(self.accumulation)
            if self.prefetch_depth < 0:
                raise ValueError(f"prefetch_depth: must be >= 0, got {self.prefetch_depth}")
            if not 0 < self.compute_efficiency <= 1:
                raise ValueError(f"compute_efficiency: must be in (0, 1], got {self.compute_efficiency}")
            if self.state_placement not in ("auto", "ssd"):
                raise ValueError(f"state_placement: must be auto or ssd; got {self.state_placement!r}")
            if self.optimizer_chunk < 1024:
                raise ValueError(f"optimizer_chunk: must be >= 1024 elements, got {self.optimizer_chunk}")
            optimizer_format(self.optimizer)

    def __init__(self, config: "LLMPlanner.Config"):
        self.config = config
        #: the optimizer schedule's spec: what its updates hold, move and leave exposed
        self.schedule: ScheduleSpec = schedule_spec(config.optimizer_schedule)
        #: the optimizer state format: what rests per parameter
        self.format = optimizer_format(config.optimizer)
        #: where updates run: inline on the training thread only when asked and the schedule can
        self.inline_updates = self.schedule.executor(config.inline_updates) is ExecutorKind.INLINE
        #: the order of micro-batches being planned, and each order's profile of one pass (per profile planned)
        self.accumulation: AccumulationSpec = candidates(config.accumulation, config.grad_accum)[0]
        self._step_profiles: dict[str, tuple[ModelProfile, ModelProfile]] = {}
        # what depends only on the profile and the hardware, not on the candidate: the search scores thousands
        self._shared = _Remembered()

    # _homes results of the last profile planned, by (host room, chunk): every candidate of a search asks again
    _homes_profile = property(lambda self: self._shared.homes_profile,
                              lambda self, value: setattr(self._shared, "homes_profile", value))
    _homes_cache = property(lambda self: self._shared.homes_cache,
                            lambda self, value: setattr(self._shared, "homes_cache", value))

    def for_config(self, **changes) -> "LLMPlanner":
        """A planner of these settings with ``changes`` (budgets, ties, the step ceiling) that shares what this one
        remembers of the profiles it planned, and what it learns later (none of it depends on them, or its key
        says what it depends on): a search plans one profile many times."""
        other = LLMPlanner(dataclasses.replace(self.config, **changes))
        other._shared, other._step_profiles = self._shared, self._step_profiles
        return other

    def _memo(self, profile: ModelProfile, hw: Hardware | None, key, compute):
        """``compute()`` once per ``key`` while profile and hardware (None: not used) stay the same."""
        memo = self._shared
        if memo.profile is not profile or (hw is not None and memo.hw is not hw):
            memo.profile, memo.cache = profile, {}
        if hw is not None:
            memo.hw = hw
        try:
            return memo.cache[key]
        except KeyError:
            value = memo.cache[key] = compute()
            return value

    # ------------------------------------------------------------------ plan
    def plan(self, profile: ModelProfile, hw: Hardware) -> LLMPlan:
        """The fastest placement that fits -- of those predicted within ``step_ties`` of it, the one that moves the
        fewest bytes ([Note: ties go to the fewest bytes]) -- or :class:`PlanError` naming the budget that is
        short. With accumulation AUTO, the first order of micro-batches that fits (its error: the last order's)."""
        if not profile.units:
            raise ValueError(f"{profile.model}: the profile has no units")
        cfg = self.config
        if cfg.step_ceiling is None and cfg.step_ties > 0:
            fastest = self.for_config(step_ties=0).plan(profile, hw)
            return self.for_config(step_ceiling=fastest.prediction.step_s * (1 + cfg.step_ties)).plan(profile, hw)
        orders = candidates(self.config.accumulation, self.config.grad_accum)
        if self.config.grad_accum == 1:
            orders = orders[:1]  # one micro-batch: every order is the same step
        for i, spec in enumerate(orders):
            self.accumulation = spec
            try:
                return self._plan(self._step_profile(profile), hw)
            except PlanError:
                if i == len(orders) - 1:
                    raise

    def _step_profile(self, profile: ModelProfile) -> ModelProfile:
        """The profile of one pass of the order being planned (cached per profile: every candidate asks)."""
        spec = self.accumulation
        cached = self._step_profiles.get(spec.name)
        if cached is None or cached[0] is not profile:
            cached = self._step_profiles[spec.name] = (profile, spec.step_profile(profile, self.config.grad_accum))
        return cached[1]

    _passes = property(lambda self: self.accumulation.passes(self.config.grad_accum), doc="passes per step")

    def _plan(self, profile: ModelProfile, hw: Hardware) -> LLMPlan:
        cfg = self.config
        shortfall = None  # of the candidate closest to fitting: host shortfalls first (no policy helps those)
        for depth in sorted({cfg.prefetch_depth, 0}, reverse=True):
            best = None
            for policies in self._memo(profile, None, "choices", lambda: list(self._policy_choices(profile, hw))):
                scored = self._score(profile, hw, self._split(profile, hw, policies), depth)
                if isinstance(scored, _Shortfall):
                    rank = (scored.budget != "host", scored.shortfall)
                    if shortfall is None or rank < (shortfall.budget != "host", shortfall.shortfall):
                        shortfall = scored
                    continue
                key = candidate_rank(scored.prediction, cfg.step_ceiling)
                if best is None or key < best[0]:
                    best = (key, policies, scored)
            if best is not None:
                _, policies, scored = best
                homes, sizes = scored.homes, scored.sizes
                return LLMPlan(policies=tuple(policies), state_home=homes.state_home,
                               compute_home=homes.compute_home, optimizer_schedule=cfg.optimizer_schedule, prefetch_depth=depth,
                               device_capacity=cfg.device_budget - scored.prediction.transient_bytes,
                               host_capacity=cfg.host_budget, grad_pool_bytes=sizes.grad_pool,
                               masters_bytes=sizes.masters, writeback_bytes=sizes.writeback,
                               optimizer_chunk=sizes.chunk, read_ahead_bytes=sizes.read_ahead,
                               retained_units=scored.retained_units,
                               prediction=scored.prediction,
                               device_budget=cfg.device_budget, host_budget=cfg.host_budget,
                               inline_updates=self.inline_updates,
                               grad_accum=cfg.grad_accum, grad_home=homes.grad_home,
                               accumulation=self.accumulation.name, optimizer=cfg.optimizer,
                               gather_bytes=sizes.gather)
        raise shortfall.error()

    def predict(self, profile: ModelProfile, hw: Hardware, policies: tuple[str, ...],
                depth: int | None = None) -> StepPrediction:
        """The predicted step of given policies (for ablations); raises PlanError if they do not fit."""
        profile = self._step_profile(profile)
        scored = self._score(profile, hw, self._split(profile, hw, tuple(policies)),
                             self.config.prefetch_depth if depth is None else depth)
        if isinstance(scored, _Shortfall):
            raise scored.error()
        return scored.prediction

    def _policy_choices(self, profile: ModelProfile, hw: Hardware):
        """Candidate policy tuples. See [Note: choosing the activation policy]."""
        cfg = self.config
        units = profile.units
        if isinstance(cfg.policy, tuple):
            if len(cfg.policy) != len(units):
                raise ValueError(f"policy: {len(cfg.policy)} per-unit policies given for {len(units)} units")
            yield cfg.policy
            return
        layers = [i for i, u in enumerate(units) if u.kind == "layer"]
        if cfg.policy != AUTO:
            cycle = cfg.policy.split(",")
            out = [DEFAULT.name] * len(units)
            for j, i in enumerate(layers):
                out[i] = cycle[j % len(cycle)]
            yield tuple(out)
            return
        n = len(layers)
        # Deep stacks: splits that differ by a layer or two score nearly alike, so counts step by `stride`
        # (the last step lands on n, so all-keep and all-of-one-kind stay candidates).
        stride = max(1, n // 24)
        counts = sorted(set(range(0, n + 1, stride)) | {n})
        kinds = [spec.name for spec in searched()]  # in the order they take the forward's first layers
        for split in layer_counts(len(kinds), n, counts):
            order = [name for name, c in zip(kinds, split) for _ in range(c)]
            order += [DEFAULT.name] * (n - len(order))
            out = [DEFAULT.name] * len(units)
            for i, pol in zip(layers, order):
                out[i] = pol
            yield tuple(out)

    def _split(self, profile: ModelProfile, hw: Hardware, policies: tuple[str, ...]) -> _Split:
        """What each unit's activation spec holds, moves and recomputes, added up."""
        return self._memo(profile, hw, ("split", tuple(policies)), lambda: self._add_up(profile, hw, policies))

    def _add_up(self, profile: ModelProfile, hw: Hardware, policies: tuple[str, ...]) -> _Split:
        table = self._memo(profile, hw, "unit activations", lambda: self._unit_activations(profile, hw))
        on_device = host_acts = ssd_acts = max_swapped = 0
        recompute_s = 0.0
        for row, pol in zip(table, policies):
            dev, host, ssd, flight, rec = row[pol]
            on_device += dev
            host_acts += host
            ssd_acts += ssd
            max_swapped = max(max_swapped, flight)
            recompute_s += rec
        return _Split(on_device=on_device, host_acts=host_acts, ssd_acts=ssd_acts, max_swapped=max_swapped,
                      recompute_s=recompute_s, policies=tuple(policies))

    def _unit_activations(self, profile: ModelProfile, hw: Hardware) -> list[dict]:
        """Per unit, per policy: (device, host, SSD, in-flight bytes, recompute seconds)."""
        table = []
        for u in profile.units:
            fwd_s = self._unit_times(u, hw).fwd_s
            table.append({name: (spec.device_bytes(u), spec.host_bytes(u), spec.ssd_bytes(u), spec.in_flight_bytes(u),
                                 spec.recompute_s(fwd_s)) for name, spec in ACTIVATIONS.items()})
        return table

    # -------------------------------------------------------------- scoring
    def _score(self, profile: ModelProfile, hw: Hardware, split: _Split, depth: int) -> _Scored | _Shortfall:
        """The candidate's predicted step and what its plan is built from, or the _Shortfall that rules it out:
        of its optimizer working sets that fit, the best by rank (the first of equals). What each working set
        predicts does not depend on the rank's step ceiling, so the search with ties (which plans twice: the
        fastest, then under its ceiling) predicts each candidate once."""
        cfg = self.config
        key = ("scored", self._config_key, self.accumulation.name, split.policies, depth)
        scored = self._memo(profile, hw, key, lambda: self._score_all(profile, hw, split, depth))
        if isinstance(scored, _Shortfall):
            return scored
        return min(scored, key=lambda s: candidate_rank(s.prediction, cfg.step_ceiling))

    @property
    def _config_key(self) -> tuple:
        """The settings a candidate's predictions depend on (all but how candidates are ranked)."""
        cfg = self.config
        return tuple(getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("step_ties",
                                                                                               "step_ceiling"))

    def _score_all(self, profile: ModelProfile, hw: Hardware, split: _Split, depth: int) -> list[_Scored] | _Shortfall:
        """Every optimizer working set of the candidate that fits, predicted (the optimizer thread: the first that
        fits), or the _Shortfall that rules the candidate out."""
        cfg = self.config
        units = profile.units
        cb = profile.compute_bytes
        # ---- device ledger: weights in flight + activations that stay on the device
        window = depth + 1
        # per tensor, the device bytes its record takes beyond its size: on a GPU, the caching allocator's rounding
        rounding = self._memo(profile, hw, "rounding", lambda: {t: device_held_bytes(n * cb, cuda=hw.has_gpu)
                                                                - held_bytes(n * cb)
                                                                for t, n in profile.tensor_numel.items()})
        # an NF4 base's records are held beside the copy the unit computing dequantizes them into ([Note: a
        # frozen NF4 base] in terastack.llm.engine.fetcher)
        wbytes = self._memo(profile, hw, "weight bytes held", lambda: [
            u.weight_bytes + sum(rounding[t] + held_bytes(profile.frozen_rest.get(t, 0)) for t in dict.fromkeys(u.tensors))
            for u in units])
        weights_ws = self._memo(profile, hw, ("weights in flight", window),
                                lambda: max(sum(wbytes[i:i + window]) for i in range(len(units))))
        swap_flight = 2 * split.max_swapped
        # working memory of the unit computing (outside the ledger), the loss over the logits beside the head's,
        # and the step's data ([Note: the batch is priced] in terastack.plan.llm_profile)
        width = self.accumulation.group(cfg.grad_accum)
        transient = self._memo(profile, None, ("transient", cfg.grad_accum, width), lambda: (
            profile.working_bytes + data_bytes(profile.tokens // width, cfg.grad_accum, stacked=width > 1)))
        resident = 0  # frozen weights resting in the device tier
        if hw.has_gpu and cfg.frozen_on_device:
            frozen, streamed_ws, _ = self._memo(profile, hw, ("frozen on the device", window, "rounded"),
                                                lambda: self._frozen_on_device(profile, window, rounding))
            if frozen and frozen + streamed_ws + split.on_device + swap_flight + transient <= cfg.device_budget:
                resident, weights_ws = frozen, streamed_ws
        device_ledger = resident + weights_ws + split.on_device + swap_flight
        if device_ledger + transient > cfg.device_budget:
            return _Shortfall(
                budget="device", needed=device_ledger + transient, available=cfg.device_budget, limit=cfg.device_budget,
                what=lambda: f"{profile.model}: weights of {window} unit(s) in flight ({format_bytes(weights_ws)}), "
                     f"activations ({format_bytes(split.on_device)} kept, {format_bytes(swap_flight)} "
                     f"in flight) and one unit's working memory with the loss and the batch's data ({format_bytes(transient)})")
        # ---- host ledger: gradient pool, optimizer working set, host-swapped activations, then state; every
        #      working set that fits is scored ([Note: the optimizer's window] in terastack.plan.optimizer_sizes)
        fitting: list[_Scored] = []
        candidates = self._memo(profile, None, ("optimizer sizes", self._passes),
                                lambda: self._optimizer_sizes(profile))
        # with an accelerator, transfers are staged through pinned host memory taken from the host budget
        staging = staging_cap(max(profile.tensor_numel.values()) * cb, cfg.host_budget) if hw.has_gpu else 0
        for sizes in candidates:
            host_fixed = sizes.host_bytes + split.host_acts + staging
            if host_fixed > cfg.host_budget:
                continue
            room = cfg.host_budget - host_fixed if cfg.state_placement == "auto" else 0
            homes = self._homes(profile, room, sizes.chunk, frozen_on_device=bool(resident))
            retention = self._retention(profile, split, homes.state_home, capacity=cfg.device_budget - transient,
                                        base=resident + weights_ws + swap_flight, rounding=rounding)
            waits, reread = self._memo(profile, hw, ("state waits", sizes, id(homes.state_home)), lambda: (
                homes.state_home, self._state_waits(profile, hw, sizes, homes)))[1]
            pred = self._predict(profile, hw, split, homes, homes.ssd_read_bytes - retention.ssd_read_saved + reread,
                                 homes.ssd_write_bytes, depth, device_peak=max(device_ledger, retention.device_peak),
                                 host_peak=host_fixed + homes.host_bytes, transient=transient, state_waits_s=waits,
                                 retained_read_saved=retention.ssd_read_saved, masters_reread=reread)
            fitting.append(_Scored(prediction=pred, homes=homes, sizes=sizes, retained_units=retention.units))
            if not self.inline_updates:
                break  # the thread's sizes differ in what the model does not price (chunk size, pool slack)
        if not fitting:
            sizes = candidates[-1]
            return _Shortfall(
                budget="host", needed=sizes.host_bytes + split.host_acts + staging, available=cfg.host_budget,
                limit=cfg.host_budget,
                what=f"{profile.model}: gradients in flight ({format_bytes(sizes.grad_pool)}), the optimizer's "
                     f"working set ({format_bytes(sizes.host_bytes - sizes.grad_pool)}), activations swapped "
                     f"to host ({format_bytes(split.host_acts)})"
                     + (f" and pinned staging ({format_bytes(staging)})" if staging else ""))
        return fitting

    def _state_waits(self, profile: ModelProfile, hw: Hardware, sizes: OptimizerSizes,
                     homes: Homes) -> tuple[float, int]:
        """(seconds inline updates wait for state beyond their window, bytes of masters read again because the
        allowance could not take them from backward). An inline update reads such a master while compute waits;
        on the optimizer thread neither is a wait."""
        reread = masters_reread(profile, self.schedule, sizes, homes.state_home, inline=self.inline_updates)
        if not self.inline_updates:
            return 0.0, reread
        read_bw = hw.ssd_read_total or 1e9
        return exposed_state_io_s(profile, self.schedule, sizes, homes.state_home, read_bw=read_bw,
                                  write_bw=hw.ssd_write_total or 1e9, fmt=self.format) + reread / read_bw, reread

    def _optimizer_sizes(self, profile: ModelProfile) -> list[OptimizerSizes]:
        """The optimizer's working sets the candidates are scored with, largest first ([Note: the optimizer's
        window] in terastack.plan.optimizer_sizes)."""
        return size_candidates(profile, self.schedule, inline=self.inline_updates, chunk=self.config.optimizer_chunk,
                               passes=self._passes, fmt=self.format)
