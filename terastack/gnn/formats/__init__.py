"""Readers for the dataset layouts people have on disk, streamed into terastack's dataset format.

* OGB node property prediction, CSV (ogbn-arxiv, ogbn-products) and npz (ogbn-papers100M): :mod:`.ogb`
* IGB homogeneous (tiny ... full): :mod:`.igb`
* a PyG ``Data`` / dataset in memory: :func:`.pyg_data.from_pyg`
* layout detection from a directory (``terastack gnn import --from DIR``): :mod:`.detect`

All of them go through :class:`.source.SourceImporter` (resumable, bounded memory, progress).
"""
