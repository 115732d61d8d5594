"""The ``sglang`` console script."""
