"""A replayed request: one that brings the tokens it had already generated in an engine that died.

The sequence starts as ``prompt + output_ids`` with ``num_prompt_tokens`` the prompt's length, so
that everything that looks at its output sees those tokens as output: ``max_new_tokens`` and
``min_new_tokens`` count them, the penalties see them, prompt log-probabilities cover the prompt
alone. The end checks (end of sequence, stop tokens) run on sampled tokens only, so they are not
applied to the replayed ones again. Its cumulative log-probability continues from the request's.

A seeded generator must continue where the first run's stopped: every token a sampling request
gets costs its generator exactly one ``torch.multinomial`` over one row of probabilities
(:func:`~lmiserve.generation.sampling.sample_rows`), and how far that call advances the generator
depends on the row's length, dtype and device only, never on its values (one sample is drawn by
the exponential race: a draw per entry of the row). :func:`advance` repeats that call on a row of
the same shape, once per replayed token; the engine does so when the generator is first used,
where the row is known. Every path that samples draws that way: serial and overlapped steps alike
(the CPU's sampling kernel computes the greedy token and the log-sum-exp only, it draws nothing).
On CUDA, ``torch.multinomial`` takes the same exponential race, whose Philox offset grows with the
row's length alone, so the same repetition holds there; the tests measure it on the CPU. Guided decoding's grammar state is advanced over the replayed tokens when
the request arrives (a token the grammar refuses refuses the request).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from ...wire import SamplingParams


def check(
    prompt_ids: Seq[int], output_ids: Seq[int], params: SamplingParams, vocab_size: int, max_model_len: int
) -> None:
    """Raise ValueError when a replay cannot continue (the request is refused)."""
    if params.n != 1 or params.best_of != 1 or params.num_beams != 1:
        raise ValueError("a request with output_ids must have n, best_of and num_beams 1")
    if len(output_ids) >= params.max_new_tokens:
        raise ValueError(
            f"output_ids holds {len(output_ids)} tokens: max_new_tokens ({params.max_new_tokens}) leaves none to generate"
        )
    if len(prompt_ids) + len(output_ids) >= max_model_len:
        raise ValueError(
            f"the prompt and output_ids hold {len(prompt_ids) + len(output_ids)} tokens; max_model_len is {max_model_len}"
        )
    if max(output_ids) >= vocab_size or min(output_ids) < 0:
        raise ValueError("output_ids holds token ids outside the vocabulary")


def advance(generator: torch.Generator, row: torch.Tensor, draws: int) -> None:
    """Advance ``generator`` past ``draws`` samplings of one token from a row shaped like ``row``."""
    if draws <= 0:
        return
    uniform = torch.ones_like(row)
    for _ in range(draws):
        torch.multinomial(uniform, 1, generator=generator)
