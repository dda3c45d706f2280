"""Media parts in the protocols' JSON: what each parser records, and a clear refusal for each
malformed part (never a 500)."""

from __future__ import annotations

import orjson
import pytest

from lmiserve.errors import BadRequest, ValidationFailed
from lmiserve.formatters import openai_chat, tgi
from lmiserve.formatters.media_parts import inputs_parts, markdown_images
from lmiserve.formatters.validation import validated


def _chat(parts):
    return validated(openai_chat.ChatRequest, {"messages": [{"role": "user", "content": parts}]})


def test_openai_parts_become_refs_and_template_parts():
    req = _chat(
        [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": "https://h/a.png", "detail": "low"}},
            {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
        ]
    )
    generation = openai_chat.generation_request(req, "prompt", 16)
    assert [(m.kind, m.source, m.where) for m in generation.media] == [
        ("image", "https://h/a.png", "messages[0].content[1]"),
        ("image", "data:image/png;base64,AAAA", "messages[0].content[2]"),
    ]
    assert generation.media_at is None  # the chat template places the pictures
    assert req.messages[0].template_dict()["content"] == [
        {"type": "text", "text": "Compare"},
        {"type": "image"},
        {"type": "image"},
    ]
    assert (
        _chat([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]).messages[0].template_dict()["content"]
        == "ab"
    )  # text-only messages stay strings for text-only templates


@pytest.mark.parametrize(
    "part,fragment",
    [
        ({"type": "image_url"}, "needs a non-empty 'image_url'"),
        ({"type": "image_url", "image_url": {"url": 5}}, "needs a non-empty 'image_url'"),
        ({"type": "image_url", "image_url": {"url": "  "}}, "needs a non-empty 'image_url'"),
        ({"type": "image_url", "image_url": ["x"]}, "needs a non-empty 'image_url'"),
    ],
)
def test_malformed_openai_parts_are_refused_naming_the_part(part, fragment):
    req = _chat([part])
    with pytest.raises(ValidationFailed, match=fragment) as err:
        openai_chat.generation_request(req, "prompt", 16)
    assert err.value.detail.startswith("messages[0].content[0]: ")


def test_unknown_part_types_are_refused():
    with pytest.raises((ValidationFailed, BadRequest), match="input_file"):
        _chat([{"type": "input_file", "file": {}}])


def test_mindie_inputs_place_each_picture_on_its_own_line():
    prompt, refs, at = inputs_parts(
        [
            {"type": "image_url", "image_url": "/p/a.png"},
            {"type": "text", "text": "first"},
            {"type": "image_url", "image_url": {"url": "https://h/b.jpg"}},
            {"type": "video_url", "video_url": "/p/v.mp4"},
            {"type": "text", "text": "last"},
        ]
    )
    assert prompt == "\nfirst\n\n\nlast"
    assert at == [0, 7, 8]
    assert [(m.kind, m.source, m.where) for m in refs] == [
        ("image", "/p/a.png", "inputs[0]"),
        ("image", "https://h/b.jpg", "inputs[2]"),
        ("video", "/p/v.mp4", "inputs[3]"),
    ]


@pytest.mark.parametrize(
    "inputs,fragment",
    [
        ([{"type": "image_url", "image_url": "/p/a.png"}], "no text part"),
        (
            [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": ""}],
            "inputs[1]: this image_url part needs",
        ),
        ([{"type": "text", "text": "x"}, {"type": "image_url", "image_url": None}], "inputs[1]"),
        ([{"type": "text", "text": "x"}, {"type": "picture"}], "inputs[1]: type must be one of"),
        ([{"type": "text", "text": "x"}, "image"], "inputs[1]: type must be one of"),
    ],
)
def test_malformed_mindie_inputs_are_refused(inputs, fragment):
    with pytest.raises(ValidationFailed) as err:
        tgi.parse(orjson.dumps({"inputs": inputs}), None, mindie=True)
    assert fragment in err.value.detail


def test_markdown_images_leave_the_text_around_them():
    prompt, refs, at = markdown_images("Look ![a cat](https://h/c.png) and ![](data:image/png;base64,AA) ok [x](y)")
    assert prompt == "Look  and  ok [x](y)"
    assert at == [5, 10]
    assert [m.source for m in refs] == ["https://h/c.png", "data:image/png;base64,AA"]
    assert markdown_images("no pictures") == ("no pictures", [], [])
