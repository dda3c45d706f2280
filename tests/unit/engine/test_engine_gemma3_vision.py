"""Gemma 3 with its SigLIP tower on the engine: a picture's tokens attend to each other both ways,
prompt chunks never end inside a picture, and the greedy tokens equal transformers' (which differ
from what causal attention over the picture would give)."""

from __future__ import annotations

import pytest

from tests.tiny_gemma3_vision import build_gemma3, gemma3_prompt, hf_gemma3_greedy
from tests.tiny_vision import picture

from .engine_helpers import make_engine, run_pictures

pytestmark = pytest.mark.usefixtures("scheduling")

LOOK = "<s>user\nLook <start_of_image> what is it?</s>\n<s>assistant\n"
CASES = {
    "one picture": (LOOK, [1]),
    "two pictures": ("<s>user\n<start_of_image> and <start_of_image>, which?</s>\n<s>assistant\n", [3, 4]),
    "text only": ("<s>user\nThe quick brown fox jumps over the lazy dog.</s>\n<s>assistant\n", []),
}


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return build_gemma3(tmp_path_factory.mktemp("gemma3"), seed=2)


@pytest.fixture(scope="module")
def references(gemma_dir):
    out = {}
    for name, (text, seeds) in CASES.items():
        pictures = [picture(s) for s in seeds]
        ids = gemma3_prompt(gemma_dir, text, len(pictures))
        out[name] = (ids, hf_gemma3_greedy(gemma_dir, ids, pictures, 10), pictures)
    return out


def _run(engine, requests):
    return run_pictures(engine, requests, 10)


def test_the_reference_depends_on_the_pictures_attending_both_ways(gemma_dir, references):
    ids, expected, pictures = references["one picture"]
    assert expected != hf_gemma3_greedy(gemma_dir, ids, pictures, 10, bidirectional=False)


@pytest.mark.parametrize("budget", [7, 256])
def test_each_prompt_alone_equals_transformers(gemma_dir, references, budget):
    engine = make_engine(gemma_dir, max_num_batched_tokens=budget)  # 7: chunks move to a picture's edges
    for name, (ids, expected, pictures) in references.items():
        assert _run(engine, {name: (ids, pictures)})[name] == expected, name


def test_together_and_again_from_the_prefix_cache(gemma_dir, references):
    engine = make_engine(gemma_dir, max_num_batched_tokens=64)
    requests = {name: (ids, pictures) for name, (ids, _, pictures) in references.items()}
    for round_ in range(2):  # the second round reads the first's blocks from the prefix cache
        tokens = _run(engine, {f"{name}-{round_}": r for name, r in requests.items()})
        for name, (_, expected, _) in references.items():
            assert tokens[f"{name}-{round_}"] == expected, (name, round_)
    assert engine.blocks.prefix_hit_tokens > 0
