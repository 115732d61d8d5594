"""A simulated SGLang 0.5.23 server for tests of the gpufleet.sglang collection.

Same command lines, process titles, HTTP endpoints and log lines as the real server, on GPUs
simulated by ``simgpu``. See tests/simsglang/README.md.
"""

from sglang.version import __version__

__all__ = ["__version__"]
