"""The DaCe evaluation: NPBench-style kernels in NumPy, DaCe and Numba, validated, timed and scaled with MPI."""
