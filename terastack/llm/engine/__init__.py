"""The offloaded engine's parts: the runtime every stage shares (:mod:`.runtime`), the step (:mod:`.step`),
optimizer schedules (:mod:`.schedules`), the weight fetcher (:mod:`.fetcher`), the offloaded optimizer
(:mod:`.optimizer`, composing :mod:`.gradient_intake`, :mod:`.optimizer_state` and :mod:`.adamw`), what a unit
keeps for its backward (:mod:`.unit_policies`) and its saved activations (:mod:`.activations`), streamed units
(:mod:`.streamed_units`), gradient sums (:mod:`.accumulate`), record names (:mod:`.records`), store layout
(:mod:`.store_layout`) and the planner's profile of a model (:mod:`.profile`). Schedules and activation
policies are the runtime halves of the specs in :mod:`terastack.plan.schedule_specs` and
:mod:`terastack.plan.activation_specs`."""
