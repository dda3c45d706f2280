"""The vLLM backend's mapping: lmiserve's sampling parameters to vLLM's, vLLM's outputs to deltas."""

import dataclasses
import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from lmiserve import wire
from lmiserve.rolling_batch.vllm.params import (
    RequestRefused,
    SequenceState,
    VllmApi,
    field_names,
    finish_reason,
    is_engine_dead,
    is_validation_error,
    sampling_kwargs,
    sampling_params,
)

FAKES = str(Path(__file__).resolve().parents[1] / "fakes")


@pytest.fixture(scope="module")
def fake_vllm():
    """The fake vllm package, importable only for the duration of this module."""
    sys.path.insert(0, FAKES)
    try:
        yield importlib.import_module("vllm")
    finally:
        sys.path.remove(FAKES)
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def api(fake_vllm) -> VllmApi:
    return VllmApi.load()


# --- parameters -------------------------------------------------------------------------------


def test_api_of_the_installed_vllm(api, fake_vllm):
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    assert api.sampling_params is fake_vllm.SamplingParams
    assert api.delta_kind is RequestOutputKind.DELTA
    assert api.structured is StructuredOutputsParams and api.structured_field == "structured_outputs"
    assert api.version == "0.0.0+fake"


def test_lmi_parameters_map_to_vllm_fields(api):
    params = wire.SamplingParams(
        max_new_tokens=50,
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.3,
        frequency_penalty=0.2,
        seed=7,
        stop_token_ids=[5, 9],
        ignore_eos=True,
        min_new_tokens=3,
        logprobs=2,
        prompt_logprobs=1,
        bad_words=["foo bar"],
        bad_word_ids=[[1, 2]],
    )
    sp = sampling_params(params, api)
    assert sp.bad_words == ["foo bar"]  # vLLM tokenizes them itself
    assert (sp.max_tokens, sp.min_tokens, sp.n) == (50, 3, 1)
    assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p) == (0.7, 20, 0.9, 0.05)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.1, 0.3, 0.2)
    assert sp.seed == 7 and sp.stop_token_ids == [5, 9] and sp.ignore_eos
    assert sp.logprobs == 2 and sp.prompt_logprobs == 1
    assert sp.stop is None  # stop strings are the output processor's
    assert sp.detokenize is False and sp.output_kind is api.delta_kind


def test_greedy_when_not_sampling(api):
    sp = sampling_params(wire.SamplingParams(do_sample=False, temperature=0.5, top_k=5, top_p=0.5, min_p=0.2), api)
    assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p) == (0.0, -1, 1.0, 0.0)


def test_top_k_zero_means_all_tokens(api):
    assert sampling_params(wire.SamplingParams(do_sample=True, top_k=0), api).top_k == -1


def test_each_sequence_gets_its_own_seed(api):
    params = wire.SamplingParams(do_sample=True, n=3, seed=11)
    assert [sampling_params(params, api, i).seed for i in range(3)] == [11, 12, 13]
    assert sampling_params(wire.SamplingParams(do_sample=True, n=2), api, 1).seed is None


def test_token_logprobs_always_asked_and_prompt_logprobs_only_when_wanted(api):
    sp = sampling_params(wire.SamplingParams(), api)
    assert sp.logprobs == 0 and sp.prompt_logprobs is None
    assert sampling_params(wire.SamplingParams(prompt_logprobs=0), api).prompt_logprobs == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (wire.SamplingParams(do_sample=True, typical_p=0.5), "typical_p"),
        (wire.SamplingParams(guided=wire.GuidedDecoding("ebnf", "root ::= x")), "'ebnf'"),
    ],
)
def test_refusals(api, params, message):
    with pytest.raises(RequestRefused, match="not available on the vllm backend") as info:
        sampling_params(params, api)
    assert message in str(info.value)


def test_best_of_and_greedy_typical_p_are_fine(api):
    sampling_params(wire.SamplingParams(n=2, best_of=2, do_sample=True), api)
    params = wire.SamplingParams(n=1, best_of=3, do_sample=True, seed=5)
    assert [sampling_params(params, api, i).seed for i in range(3)] == [5, 6, 7]  # one vLLM request each
    sampling_params(wire.SamplingParams(typical_p=0.5), api)


def test_typical_p_travels_in_extra_args_where_vllm_takes_them(api):
    import dataclasses

    from lmiserve.rolling_batch.vllm.params import TYPICAL_P_KEY

    newer = dataclasses.replace(api, typical_p=True)  # vLLM 0.10 and later: SamplingParams(extra_args=...)
    kw = sampling_kwargs(wire.SamplingParams(do_sample=True, typical_p=0.4), newer)
    assert kw["extra_args"] == {TYPICAL_P_KEY: 0.4}
    assert "extra_args" not in sampling_kwargs(wire.SamplingParams(do_sample=True), newer)
    assert "extra_args" not in sampling_kwargs(wire.SamplingParams(typical_p=0.4), newer)  # greedy: no filter


def test_vllm_own_checks_raise_value_errors(api):
    with pytest.raises(ValueError, match="top_p"):
        sampling_params(wire.SamplingParams(do_sample=True, top_p=0.0), api)


def test_guided_decoding_to_structured_outputs(api):
    schema = '{"type": "object"}'
    so = sampling_params(wire.SamplingParams(guided=wire.GuidedDecoding("json_schema", schema)), api).structured_outputs
    assert so.json == schema and so.regex is None
    assert sampling_params(
        wire.SamplingParams(guided=wire.GuidedDecoding("json_object")), api
    ).structured_outputs.json_object
    regex = sampling_params(wire.SamplingParams(guided=wire.GuidedDecoding("regex", "[0-9]+")), api)
    assert regex.structured_outputs.regex == "[0-9]+"
    grammar = sampling_params(wire.SamplingParams(guided=wire.GuidedDecoding("grammar", 'root ::= "a"')), api)
    assert grammar.structured_outputs.grammar == 'root ::= "a"'
    choice = sampling_params(wire.SamplingParams(guided=wire.GuidedDecoding("choice", '["x", "y"]')), api)
    assert choice.structured_outputs.choice == ["x", "y"]


def test_guided_decoding_on_older_vllm_and_without_it(api):
    @dataclasses.dataclass
    class GuidedDecodingParams:
        json: str | None = None
        regex: str | None = None
        json_object: bool | None = None

    legacy = VllmApi(api.sampling_params, api.delta_kind, GuidedDecodingParams, "guided_decoding", "0.8")
    kw = sampling_kwargs(wire.SamplingParams(guided=wire.GuidedDecoding("regex", "a+")), legacy)
    assert kw["guided_decoding"] == GuidedDecodingParams(regex="a+")
    bare = VllmApi(api.sampling_params, api.delta_kind, version="0.5")
    with pytest.raises(RequestRefused, match="constrained decoding is not available with the installed vLLM"):
        sampling_kwargs(wire.SamplingParams(guided=wire.GuidedDecoding("json_object")), bare)


def test_without_delta_outputs_no_output_kind_is_asked(api):
    kw = sampling_kwargs(wire.SamplingParams(), VllmApi(api.sampling_params))
    assert "output_kind" not in kw


def test_field_names_of_structs_dataclasses_and_classes():
    class Struct(msgspec.Struct):
        a: int = 0
        b: int = 1

    @dataclasses.dataclass
    class Data:
        c: int = 0

    class Plain:
        def __init__(self, d=0, e=1):
            pass

    assert field_names(Struct) == {"a", "b"} and field_names(Data) == {"c"} and field_names(Plain) == {"d", "e"}


# --- outputs ----------------------------------------------------------------------------------


def lp(value, rank=1):
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=None)


def output(ids, logprobs=None, finish=None, stop_reason=None, cumulative=None, prompt=None, cached=None):
    completion = SimpleNamespace(
        index=0,
        text="",
        token_ids=ids,
        logprobs=logprobs,
        finish_reason=finish,
        stop_reason=stop_reason,
        cumulative_logprob=cumulative,
    )
    return SimpleNamespace(
        outputs=[completion], finished=finish is not None, prompt_logprobs=prompt, num_cached_tokens=cached
    )


@pytest.mark.parametrize(
    ("reason", "stop_reason", "expected"),
    [
        (None, None, None),
        ("length", None, "length"),
        ("stop", None, "eos_token"),
        ("stop", 13, "stop_sequence"),
        ("stop", "###", "stop_sequence"),
        ("abort", None, "abort"),
    ],
)
def test_finish_reasons(reason, stop_reason, expected):
    assert finish_reason(reason, stop_reason) == expected


def test_delta_outputs_become_deltas():
    params = wire.SamplingParams(logprobs=1, prompt_logprobs=1)
    state = SequenceState("r", 2, [7, 8, 9], params)
    prompt = [None, {8: lp(-1.0, 2), 5: lp(-0.5, 1)}, {9: lp(-2.0, 1), 6: lp(-3.0, 2)}]
    first = state.delta(output([10], [{10: lp(-0.1), 11: lp(-0.2, 2)}], cumulative=-0.1, prompt=prompt, cached=2))
    assert first.request_id == "r" and first.index == 2
    assert first.token_ids == [10] and first.logprobs == [-0.1] and first.cumulative_logprob == -0.1
    assert first.top_logprobs == [[wire.TopLogprob(10, -0.1)]]
    assert first.num_prompt_tokens == 3 and first.num_cached_tokens == 2
    assert first.prompt_logprobs == [None, -1.0, -2.0]
    assert first.prompt_top_logprobs == [[wire.TopLogprob(5, -0.5)], [wire.TopLogprob(9, -2.0)]]
    assert first.finish_reason is None
    last = state.delta(output([12, 2], [{12: lp(-0.3)}, {2: lp(-0.4)}], finish="stop", cumulative=-0.8))
    assert last.token_ids == [12, 2] and last.logprobs == [-0.3, -0.4] and last.cumulative_logprob == -0.8
    assert last.finish_reason == "eos_token" and last.num_prompt_tokens == 0 and last.prompt_logprobs is None
    assert state.delta(output([], finish="stop")) is None  # nothing after the end


def test_cumulative_outputs_are_sliced():
    state = SequenceState("r", 0, [1, 2], wire.SamplingParams(prompt_logprobs=0), cumulative=True)
    prompt = [None, {2: lp(-1.5)}]
    a = state.delta(output([5], [{5: lp(-0.1)}], prompt=prompt, cumulative=-0.1))
    b = state.delta(output([5, 6, 7], [{5: lp(-0.1)}, {6: lp(-0.2)}, {7: lp(-0.3)}], prompt=prompt, cumulative=-0.6))
    c = state.delta(output([5, 6, 7, 8], None, finish="length", prompt=prompt))
    assert (a.token_ids, b.token_ids, c.token_ids) == ([5], [6, 7], [8])
    assert b.logprobs == [-0.2, -0.3] and c.logprobs == []
    assert a.prompt_logprobs == [None, -1.5] and a.prompt_top_logprobs is None
    assert b.prompt_logprobs is None and c.prompt_logprobs is None
    assert c.finish_reason == "length"


def test_empty_outputs_are_skipped_until_they_end_something():
    state = SequenceState("r", 0, [1], wire.SamplingParams())
    assert state.delta(output([])) is None
    aborted = state.delta(output([], finish="abort"))
    assert aborted.finish_reason == "abort" and aborted.num_prompt_tokens == 1


def test_finished_without_reason_is_an_abort_and_error_is_an_error():
    state = SequenceState("r", 0, [1], wire.SamplingParams())
    ended = SimpleNamespace(outputs=[], finished=True, prompt_logprobs=None, num_cached_tokens=None)
    assert state.delta(ended).finish_reason == "abort"
    failed = SequenceState("r", 1, [1], wire.SamplingParams()).delta(output([4], finish="error"))
    assert failed.finish_reason == "error" and failed.error and failed.index == 1


def test_top_logprobs_leave_out_a_chosen_token_outside_the_top():
    state = SequenceState("r", 0, [1], wire.SamplingParams(logprobs=2))
    delta = state.delta(output([9], [{9: lp(-3.0, 5), 4: lp(-0.1, 1), 6: lp(-0.2, 2)}]))
    assert delta.logprobs == [-3.0]
    assert delta.top_logprobs == [[wire.TopLogprob(4, -0.1), wire.TopLogprob(6, -0.2)]]


def test_error_classes():
    class EngineDeadError(Exception):
        pass

    class VLLMClientError(Exception):
        pass

    class Special(EngineDeadError):
        pass

    assert is_engine_dead(EngineDeadError()) and is_engine_dead(Special()) and not is_engine_dead(ValueError())
    assert is_validation_error(ValueError()) and is_validation_error(VLLMClientError())
    assert not is_validation_error(RuntimeError())
