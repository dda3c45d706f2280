"""vLLM's ``/tokenize`` and ``/detokenize`` bodies: which body is whose, defaults, refusals, answers."""

import orjson
import pytest

from lmiserve.errors import ValidationFailed
from lmiserve.formatters import errors, vllm_tokenize

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("data", "vllm"),
    [
        ({"prompt": "x"}, True),
        ({"messages": MESSAGES}, True),
        ({"inputs": "x"}, False),
        ({"inputs": "x", "prompt": "y"}, False),
        ({"model": "m"}, False),
        ([1], False),
        (None, False),
    ],
)
def test_tgi_and_vllm_bodies_are_told_apart(data, vllm):
    assert vllm_tokenize.is_vllm_tokenize(data) is vllm


def test_defaults_follow_vllm():
    prompt = vllm_tokenize.parse_tokenize({"prompt": "x"})
    assert isinstance(prompt, vllm_tokenize.TokenizePrompt)
    assert prompt.add_special_tokens is True and prompt.return_token_strs is False and prompt.model is None
    chat = vllm_tokenize.parse_tokenize({"messages": MESSAGES, "model": "m", "tools": [{"function": {"name": "f"}}]})
    assert isinstance(chat, vllm_tokenize.TokenizeChat)
    assert (chat.add_generation_prompt, chat.continue_final_message, chat.add_special_tokens) == (True, False, False)
    assert chat.template_messages() == [{"role": "user", "content": "hi"}]
    assert chat.tool_dicts == [{"name": "f"}]
    assert vllm_tokenize.parse_tokenize({"messages": MESSAGES}).tool_dicts is None
    # continue_final_message with the generation prompt left at its default is fine (as vLLM)
    assert vllm_tokenize.parse_tokenize({"messages": MESSAGES, "continue_final_message": True}).continue_final_message


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"prompt": 1}, "prompt"),
        ({"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
        ({"messages": [{"role": "x", "content": "y"}]}, "messages.0.role"),
        ({"messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": True}, "Cannot set both"),
    ],
)
def test_bad_tokenize_bodies(data, says):
    with pytest.raises(ValidationFailed) as err:
        vllm_tokenize.parse_tokenize(data)
    assert says in str(err.value)


def test_detokenize_bodies_and_vocabulary():
    assert vllm_tokenize.parse_detokenize({"tokens": [1, 2], "model": "m"}).tokens == [1, 2]
    for data in ({"tokens": [-1]}, {"tokens": [2**63]}, {"tokens": "1"}, {"prompt": "x"}, [1]):
        with pytest.raises(ValidationFailed):
            vllm_tokenize.parse_detokenize(data)
    vllm_tokenize.check_ids([0, 9], 10)
    vllm_tokenize.check_ids([], 10)
    with pytest.raises(ValidationFailed) as err:
        vllm_tokenize.check_ids([3, 10], 10)
    status, body = errors.openai(err.value)
    assert status == 400
    assert body == {
        "error": {
            "message": "Token id 10 is out of vocabulary",
            "type": "invalid_request_error",
            "param": "tokens",
            "code": 400,
        }
    }


def test_answers():
    assert orjson.loads(vllm_tokenize.tokenize_body([5, 6], 256, None)) == {
        "count": 2,
        "max_model_len": 256,
        "tokens": [5, 6],
        "token_strs": None,
    }
    assert orjson.loads(vllm_tokenize.tokenize_body([5], 8, ["a"]))["token_strs"] == ["a"]
    assert vllm_tokenize.detokenize_body("hé") == '{"prompt":"hé"}'.encode()
