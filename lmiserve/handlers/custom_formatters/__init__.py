"""A model's own input and output formatters, the DJL way: functions in ``model.py`` marked
``@input_formatter`` / ``@output_formatter`` (or named by ``option.output_formatter``), found at
load time, turning a body into an LMI request and every update into what is sent."""

from .decorators import content_type_of, formatter_kind, input_formatter, output_formatter
from .inputs import FormattedInput, normalize, parse_custom, to_request
from .loading import CustomFormatters, formatters_only, load_custom_formatters
from .responder import CustomResponder, FormatterFailed, error_payload

__all__ = [
    "CustomFormatters",
    "CustomResponder",
    "FormattedInput",
    "FormatterFailed",
    "content_type_of",
    "error_payload",
    "formatter_kind",
    "formatters_only",
    "input_formatter",
    "load_custom_formatters",
    "normalize",
    "output_formatter",
    "parse_custom",
    "to_request",
]
