"""terastack: train models and data larger than memory on hardware people can afford."""
__version__ = "0.1.0"
