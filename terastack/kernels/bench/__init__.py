"""``terastack bench gemm`` and ``terastack bench sort``: the out-of-core kernels, pipelined against synchronous I/O."""
