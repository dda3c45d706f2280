"""The djl_python compatibility package: what imports, what refuses and with which advice."""

from __future__ import annotations

import importlib

import pytest

import djl_python
from lmiserve.formatters import request_io
from lmiserve.handlers import custom_formatters as custom
from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import Output


def test_supported_names_are_lmiserve_classes():
    from djl_python import Input as I1
    from djl_python import Output as O1
    from djl_python.inputs import Input as I2
    from djl_python.outputs import Output as O2

    assert I1 is I2 is Input and O1 is O2 is Output
    assert importlib.import_module("djl_python.output_formatter").output_formatter is custom.output_formatter
    assert importlib.import_module("djl_python.input_parser").input_formatter is custom.input_formatter
    rio = importlib.import_module("djl_python.request_io")
    for name in ("TextGenerationOutput", "Token", "Sequence", "RequestInput", "TextInput"):
        assert getattr(rio, name) is getattr(request_io, name)


@pytest.mark.parametrize(
    ("statement", "advice"),
    [
        ("import djl_python.rolling_batch", "option.rolling_batch"),
        ("from djl_python.rolling_batch.rolling_batch import RollingBatch", "option.rolling_batch"),
        ("from djl_python import properties_manager", "serving.properties"),
        ("from djl_python.properties_manager.properties import Properties", "serving.properties"),
        ("import djl_python.huggingface", "option.entryPoint unset"),
        ("from djl_python.encode_decode import decode", "get_as_json"),
        ("import djl_python.no_such_thing", "Supported: djl_python.Input"),
    ],
)
def test_unsupported_names_fail_with_what_to_use_instead(statement, advice):
    with pytest.raises(ImportError) as info:
        exec(statement, {})
    message = str(info.value)
    assert "is not provided by lmiserve" in message
    assert advice in message
    assert "djl_python.request_io" in message  # the supported names are listed


def test_unknown_attribute_of_the_package_is_an_import_error():
    with pytest.raises(ImportError, match="djl_python.Whatever is not provided"):
        djl_python.Whatever  # noqa: B018


def test_decorators_mark_functions_and_set_content_type():
    @custom.output_formatter
    def plain(out):
        return ""

    @custom.output_formatter(content_type="text/plain")
    def typed(out):
        return ""

    @custom.input_formatter
    def parse(inputs):
        return {}

    assert custom.formatter_kind(plain) == "output" and custom.content_type_of(plain) is None
    assert custom.content_type_of(typed) == "text/plain"
    assert custom.formatter_kind(parse) == "input"
    assert custom.formatter_kind(len) is None
