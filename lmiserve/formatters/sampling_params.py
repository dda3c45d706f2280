"""Sampling parameters from a request's fields, the way LMI's rolling batch and OpenAI's
schemas read them (both name them as vLLM does), with lmiserve's ``speculate`` (false: no
speculative decoding for the request)."""

from __future__ import annotations

from typing import Any

from ..wire import SamplingParams


def sampled(p: Any, do_sample: bool = True, **rest: Any) -> SamplingParams:
    """``p``'s ``temperature``, ``top_k``, ``top_p``, ``min_p``, penalties and
    ``stop_token_ids`` and ``speculate``, with ``rest``. A temperature of 0 is greedy decoding (as vLLM); a
    ``top_k`` of -1, like 0, is no limit."""
    greedy = p.temperature == 0
    return SamplingParams(
        do_sample=do_sample and not greedy,
        temperature=p.temperature if not greedy else 1.0,
        top_k=max(p.top_k, 0),
        top_p=p.top_p,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        stop_token_ids=list(p.stop_token_ids),
        speculate=p.speculate,
        **rest,
    )


def beam_search(p: Any, width: int, n: int, ignore_eos: bool, **rest: Any) -> SamplingParams:
    """Beam search ``width`` beams wide, answering the best ``n``, with ``p``'s
    ``length_penalty``, ``early_stopping`` and ``speculate``."""
    return SamplingParams(
        n=n,
        best_of=n,
        num_beams=width,
        length_penalty=p.length_penalty,
        early_stopping=p.early_stopping,
        ignore_eos=ignore_eos,
        speculate=p.speculate,
        **rest,
    )
