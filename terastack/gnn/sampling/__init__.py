"""Sampling: fanouts (one parser for both graph kinds), the vectorized neighbour samplers (homogeneous and
heterogeneous), and the pipeline that overlaps sampling, gathering and training."""
