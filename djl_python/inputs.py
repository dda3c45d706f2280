"""``djl_python.inputs``: the request a handler receives."""

from lmiserve.handlers.inputs import Input

__all__ = ["Input"]
