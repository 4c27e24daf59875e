"""Hugging Face formats: the model files (:mod:`.model_files`), checkpoint key conversions (:mod:`.keys`), the
sharded safetensors export (:mod:`.sharded_writer`), merging a LoRA adapter (:mod:`.merge`) and checking an
export without loading it (:mod:`.export_check`)."""
