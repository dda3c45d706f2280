"""LMI's ``djl_python`` names, mapped onto lmiserve's own classes.

Handler and formatter code written for DJL's LMI containers imports from here unchanged.
Supported: ``Input``, ``Output``, ``inputs``, ``outputs``, ``output_formatter``,
``input_parser`` and ``request_io``. Importing any other ``djl_python`` name fails with an
ImportError that says what to use instead (see :mod:`djl_python._unsupported`).
"""

from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import Output

from ._unsupported import install, unsupported_message

install()

__all__ = ["Input", "Output"]


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(unsupported_message(name), name=f"djl_python.{name}")
