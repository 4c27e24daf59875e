"""``terastack bench gnn``: out-of-core training against in-memory, mmap and synchronous gathering
(:mod:`.measure`), on heterogeneous graphs (:mod:`.hetero`), at scale (:mod:`.scale`), and the workers the
baselines run in (:mod:`.workers`)."""
