"""The simulator behind the ``sglang`` package: launcher, workers, HTTP API and speed model."""
