"""Sampling: fanouts (one parser for both graph kinds), the vectorized neighbour sampler over every relation, the
pre-sampling pass that counts hotness, and the pipeline that overlaps sampling, gathering and training."""
