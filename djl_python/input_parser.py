"""``djl_python.input_parser``: the decorator that marks a custom input formatter."""

from lmiserve.formatters.custom import input_formatter
from lmiserve.formatters.request_io import RequestInput, TextInput

__all__ = ["RequestInput", "TextInput", "input_formatter"]
