from lmiserve.generation.output_processor import OutputProcessor
from lmiserve.generation.request import GenerationRequest
from lmiserve.wire import SamplingParams, SeqDelta


def run(tokenizer, text, stop=(), finish="length", include_stop=False):
    prompt_ids = tokenizer("Say:")["input_ids"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    req = GenerationRequest(
        prompt="Say:",
        params=SamplingParams(max_new_tokens=len(ids)),
        stop=list(stop),
        include_stop_str_in_output=include_stop,
    )
    proc = OutputProcessor(tokenizer, "r", req, prompt_ids)
    pieces, stopped = [], False
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        stopped = proc.apply(
            SeqDelta(request_id="r", token_ids=[token], logprobs=[-0.5], finish_reason=finish if last else None)
        )
        pieces.extend(t.text for t in proc.output.sequences[0].new_tokens)
        if stopped:
            break
    return proc.output, pieces, stopped


def test_pieces_join_to_final_text_with_multibyte_characters(tiny_tokenizer):
    text = "Große Füchse 😀 springen"
    out, pieces, _ = run(tiny_tokenizer, text)
    seq = out.sequences[0]
    assert "".join(pieces) == seq.text == text
    assert seq.finish_reason == "length" and out.finished
    assert len(seq.tokens) == len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])


def test_stop_string_ends_the_sequence_and_is_cut(tiny_tokenizer):
    out, pieces, stopped = run(tiny_tokenizer, "the quick brown fox jumps", stop=["brown"])
    assert stopped
    seq = out.sequences[0]
    assert seq.text == "the quick " == "".join(pieces)
    assert seq.finish_reason == "stop_sequence"


def test_include_stop_string(tiny_tokenizer):
    out, _, _ = run(tiny_tokenizer, "the quick brown fox", stop=["quick"], include_stop=True)
    assert out.sequences[0].text == "the quick"


def test_held_back_text_is_released_at_the_end(tiny_tokenizer):
    out, pieces, stopped = run(tiny_tokenizer, "the quick bro", stop=["brown"])
    assert not stopped and out.sequences[0].text == "the quick bro" == "".join(pieces)


def test_engine_error_marks_every_sequence(tiny_tokenizer):
    req = GenerationRequest(prompt="x", params=SamplingParams(n=2, best_of=2))
    proc = OutputProcessor(tiny_tokenizer, "r", req, [5])
    proc.apply(SeqDelta(request_id="r", finish_reason="error", error="boom"))
    assert proc.output.error == "boom" and proc.output.finished
    assert [s.finish_reason for s in proc.output.sequences] == ["error", "error"]


def _usage_after(tokenizer, batch_sizes):
    from lmiserve.formatters.openai_common import usage

    req = GenerationRequest(prompt="Say:", params=SamplingParams(max_new_tokens=len(batch_sizes)))
    proc = OutputProcessor(tokenizer, "r", req, [5])
    for i, size in enumerate(batch_sizes):
        last = i == len(batch_sizes) - 1
        proc.apply(
            SeqDelta(
                request_id="r",
                token_ids=[7 + i],
                batch_size=size,
                queue_us=10 * size,
                finish_reason="length" if last else None,
            )
        )
    return usage([proc.output])


def test_mindie_step_lists_come_from_the_engine_or_are_left_out(tiny_tokenizer):
    assert _usage_after(tiny_tokenizer, [1, 3, 2]) == {
        "prompt_tokens": 1,
        "completion_tokens": 3,
        "total_tokens": 4,
        "batch_size": [1, 3, 2],
        "queue_wait_time": [10, 30, 20],
    }
    # an engine that does not report its steps (vLLM): no lists, rather than zeros that look like data
    assert _usage_after(tiny_tokenizer, [0, 0]) == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
