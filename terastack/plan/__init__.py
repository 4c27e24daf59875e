"""terastack.plan: hardware descriptions and cost models. Depends on nothing but numpy/torch."""
from terastack.plan.hardware import PRESETS, Hardware, load_probe, probe_cache_path, save_probe

__all__ = ["Hardware", "PRESETS", "load_probe", "probe_cache_path", "save_probe"]
