"""Storage and cache: the on-disk dataset (homogeneous and heterogeneous), its topology (in memory, mapped,
or on the SSD with the compact indptr), block-aligned row reads, the unified device + host cache, the
pre-sampled hotness that ranks it, one memory budget divided by SSD bytes saved, the baselines' feature
sources, and the bounded-memory builders (generator, CSC build)."""
