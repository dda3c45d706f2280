"""Bench's workloads (random and grounded prompts), the generated text read from each protocol's
stream, the outputs written per prompt and compared, and the baseline's padded batches."""

import pytest

from lmiserve.bench.apis import APIS
from lmiserve.bench.baseline import left_padded
from lmiserve.bench.grounded_texts import CODE, PASSAGES
from lmiserve.bench.outputs import compare_outputs, output_lines, read_outputs, write_outputs
from lmiserve.bench.prompts import make_prompts
from lmiserve.bench.stats import RequestRecord, level_report
from lmiserve.bench.workloads import build, for_api, grounded_prompts

SOURCES = [text for text, _ in PASSAGES] + [text for text, _ in CODE]


def test_grounded_prompts_are_seeded_different_and_quote_their_sources():
    prompts = grounded_prompts(200, seed=3)
    assert prompts == grounded_prompts(200, seed=3) and prompts != grounded_prompts(200, seed=4)
    assert len(set(prompts)) == 200
    for prompt in prompts:
        ask, _, document = prompt.partition("\n\n")
        assert ask.startswith("Copy the following")
        assert any(source in document for source in SOURCES)
    assert any("code" in p.split("\n")[0] for p in prompts) and any("text" in p.split("\n")[0] for p in prompts)
    replaced = [p for p in prompts if "replace every" in p]
    assert replaced and all(p.split('"')[1] in p.partition("\n\n")[2] for p in replaced)  # the word is there


def test_past_the_combinations_requests_are_told_apart_by_number():
    prompts = grounded_prompts(4000, seed=0)
    assert len(set(prompts)) == 4000 and any(p.startswith("Request ") for p in prompts)


def test_the_salt_starts_every_grounded_prompt():
    assert all(p.startswith("run 7: Copy") for p in grounded_prompts(5, seed=1, salt="run 7:"))


class ChatTokenizer:
    """A tokenizer with a chat template: a word per token id."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize and messages[0]["role"] == "user"
        return f"<user>{messages[0]['content']}</user><assistant>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(range(len(text.split())))}


def test_chat_apis_send_the_message_and_completion_apis_the_chat_template():
    messages = ["Copy this: a b"]
    tokenizer = ChatTokenizer()
    assert for_api(tokenizer, messages, "openai-chat") == messages
    for api in ("lmi", "tgi", "openai"):
        assert for_api(tokenizer, messages, api) == ["<user>Copy this: a b</user><assistant>"]
    tokenizer.chat_template = None  # a base model: the message as it is
    assert for_api(tokenizer, messages, "lmi") == messages


def test_build_gives_the_texts_sent_and_the_templated_prompts_ids():
    texts, ids = build("grounded", ChatTokenizer(), 3, 0, seed=0, salt="", api="openai-chat")
    assert texts == grounded_prompts(3) and len(ids) == 3
    templated, same_ids = build("grounded", ChatTokenizer(), 3, 0, seed=0, salt="", api="lmi")
    assert templated[0].startswith("<user>Copy") and same_ids == ids
    with pytest.raises(ValueError, match="unknown workload"):
        build("nope", ChatTokenizer(), 1, 0, 0, "", "lmi")


def test_the_random_workload_is_the_seeded_prompts_of_one_length(tiny_tokenizer):
    texts, ids = build("random", tiny_tokenizer, 3, 40, seed=1, salt="", api="openai-chat")
    assert ids == make_prompts(tiny_tokenizer, 3, 40, seed=1) and len(texts) == 3


@pytest.mark.parametrize(
    ("api", "line", "tokens", "text", "reported"),
    [
        ("lmi", b'{"token": {"id": 1, "text": " a", "log_prob": -1}}', 1, " a", None),
        ("lmi", b'data:{"token": {"id": 1}}', 1, "", None),
        ("lmi", b"", 0, "", None),
        ("tgi", b'data:{"token": {"id": 1, "text": "b"}, "generated_text": null}', 1, "b", None),
        ("tgi", b"event: x", 0, "", None),
        ("openai", b'data: {"choices": [{"text": "c"}]}', 1, "c", None),
        ("openai", b'data: {"choices": [], "usage": {"completion_tokens": 9}}', 0, "", 9),
        ("openai", b"data: [DONE]", 0, "", None),
        ("openai-chat", b'data: {"choices": [{"delta": {"content": "de"}}]}', 1, "de", None),
        ("openai-chat", b'data: {"choices": [{"delta": {"reasoning_content": "r"}}]}', 1, "r", None),
        ("openai-chat", b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}', 0, "", None),
        ("openai-chat", b'data: {"choices": [], "usage": {"completion_tokens": 4}}', 0, "", 4),
    ],
)
def test_each_protocols_lines_give_tokens_text_and_the_servers_count(api, line, tokens, text, reported):
    piece = APIS[api].read(line)
    assert (piece.tokens, piece.text, piece.reported) == (tokens, text, reported)
    assert APIS[api].tokens_in(line) == tokens


def test_openai_requests_ask_for_the_usage_and_it_counts_the_tokens():
    assert APIS["openai-chat"].body("p", 8, "m")["stream_options"] == {"include_usage": True}
    # a chunk of several tokens (speculative decoding's accepted ones): the server's count wins
    record = RequestRecord(start=0.0, end=1.0)
    for line in (b'data: {"choices": [{"text": "abc"}]}', b'data: {"choices": [], "usage": {"completion_tokens": 3}}'):
        record.took(APIS["openai"].read(line), keep_text=True)
    assert record.tokens == 1 and record.output_tokens == 3 and record.pieces == ["abc"]
    assert level_report(1, [record])["output_tokens"] == 3


def test_outputs_are_written_by_prompt_index_and_compared(tmp_path):
    prompts = ["p0", "p1", "p2", "p3"]
    kept = {2: ("two", None), 0: ("zero", None), 1: ("", "HTTP 503")}
    lines = output_lines(prompts, kept, warmup={0})
    assert [line["index"] for line in lines] == [0, 1, 2]
    assert lines[0]["warmup"] and not lines[2]["warmup"] and lines[1]["error"] == "HTTP 503"
    write_outputs(lines, tmp_path / "a.jsonl")
    a = read_outputs(tmp_path / "a.jsonl")
    assert a[2]["text"] == "two"

    other = output_lines(["p0", "p1", "other", "p3"], {0: ("zero", None), 1: ("one", None), 2: ("x", None)}, set())
    result = compare_outputs(a, {line["index"]: line for line in other})
    assert result["compared"] == 1 and result["identical"] == 1  # 1 failed in a, 2 had another prompt
    assert result["errors"] == 1 and result["other_prompt"] == 1 and result["only_in_one"] == 0
    b = {**a, 0: {**a[0], "text": "zero!"}}
    assert compare_outputs(a, b)["differing"] == [0]


def test_the_baselines_batches_are_padded_on_the_left():
    ids, mask = left_padded([[5, 6, 7], [8]], pad=0)
    assert ids == [[5, 6, 7], [0, 0, 8]] and mask == [[1, 1, 1], [0, 0, 1]]
