"""Version of the SGLang release this simulator stands in for."""

__version__ = "0.5.23"
