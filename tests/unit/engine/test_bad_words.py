"""Bad words (TensorRT-LLM's ``bad_sequences``, vLLM's ``bad_words``): the engine never lets the
output end with one, and agrees with transformers' ``bad_words_ids``."""

import torch

from lmiserve.generation.admission import bad_word_ids
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import _hf, hf_greedy, make_engine, run

PROMPT = [5, 17, 42, 9, 33, 8]
N = 12


def hf_banned(model_dir, banned: list[list[int]]) -> list[int]:
    model = _hf(model_dir)
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=N, do_sample=False, bad_words_ids=banned)
    return out[0, len(PROMPT) :].tolist()


def test_single_and_multi_token_bad_words_match_transformers(tiny_llama_dir, scheduling):
    plain = hf_greedy(tiny_llama_dir, PROMPT, N)
    single, pair = [[plain[2]]], [[plain[3], plain[4]]]
    engine = make_engine(tiny_llama_dir)
    params = {
        name: SamplingParams(max_new_tokens=N, bad_word_ids=ids) for name, ids in (("one", single), ("two", pair))
    }
    arrivals = {
        0: [(name, PROMPT, p) for name, p in params.items()] + [("plain", PROMPT, SamplingParams(max_new_tokens=N))]
    }
    tokens, _, _ = run(engine, arrivals)
    assert tokens["plain"][0] == plain
    one, two = tokens["one"][0], tokens["two"][0]
    assert one[:2] == plain[:2] and plain[2] not in one
    assert two[:4] == plain[:4] and two[4] != plain[4]
    assert one == hf_banned(tiny_llama_dir, single)
    assert two == hf_banned(tiny_llama_dir, pair)


def test_bad_words_are_tokenized_bare_and_after_a_space(tiny_tokenizer):
    ids = bad_word_ids(["hello", " world"], tiny_tokenizer)
    assert tiny_tokenizer("hello", add_special_tokens=False)["input_ids"] in ids
    assert tiny_tokenizer("world", add_special_tokens=False)["input_ids"] in ids
    for word in ids:
        assert word and all(isinstance(t, int) for t in word)
