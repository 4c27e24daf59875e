"""The offloaded engine's benchmarks: ``terastack bench llm`` (:mod:`.bench_llm`), ``terastack bench llm-scale``
(:mod:`.bench_scale`) and the per-system child process both run (:mod:`.bench_worker`)."""
