"""``djl_python.input_parser``: the decorator that marks a custom input formatter."""

from lmiserve.formatters.request_io import RequestInput, TextInput
from lmiserve.handlers.custom_formatters import input_formatter

__all__ = ["RequestInput", "TextInput", "input_formatter"]
