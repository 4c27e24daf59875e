"""Training and inference: one trainer and one inference for both graph kinds (the differences as graph-kind
strategies), the PyG models, checkpoints, and data parallelism across processes."""
