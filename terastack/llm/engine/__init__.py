"""The offloaded engine's parts: the runtime every stage shares (:mod:`.runtime`), the step (:mod:`.step`),
optimizer schedules (:mod:`.schedules`), the weight fetcher (:mod:`.fetcher`), the offloaded optimizer
(:mod:`.optimizer`), saved activations (:mod:`.activations`), streamed units (:mod:`.streamed_units`), gradient
sums (:mod:`.accumulate`), record names (:mod:`.records`), store layout (:mod:`.store_layout`) and the planner's
profile of a model (:mod:`.profile`)."""
