"""``djl_python.outputs``: the response a handler returns."""

from lmiserve.handlers.outputs import Output

__all__ = ["Output"]
