"""``djl_python.request_io``: what custom formatters receive and return."""

from lmiserve.formatters.request_io import RequestInput, Sequence, TextGenerationOutput, TextInput, Token

__all__ = ["RequestInput", "Sequence", "TextGenerationOutput", "TextInput", "Token"]
