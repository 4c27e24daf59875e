"""Storage and cache: the on-disk dataset of either kind (its manifest and the typed graph it opens as), its
topology (in memory, mapped, or on the SSD with the compact indptr), block-aligned row reads, the unified
device + host cache and the feature sources per node type, one memory budget divided by SSD bytes saved, the
baselines' feature sources, and the bounded-memory builders (generator, CSC build)."""
