"""``djl_python.output_formatter``: the decorator that marks a custom output formatter."""

from lmiserve.formatters.custom import output_formatter
from lmiserve.formatters.request_io import TextGenerationOutput

__all__ = ["TextGenerationOutput", "output_formatter"]
