"""``djl_python.output_formatter``: the decorator that marks a custom output formatter."""

from lmiserve.formatters.request_io import TextGenerationOutput
from lmiserve.handlers.custom_formatters import output_formatter

__all__ = ["TextGenerationOutput", "output_formatter"]
