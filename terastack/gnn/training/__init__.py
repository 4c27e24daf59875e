"""Training and inference: one trainer and one inference for both graph kinds over the one placement call
(terastack.gnn.graph_placement), the PyG models, model files and run checkpoints, and data parallelism across
processes."""
