"""How many prompt tokens a step that also decodes takes under the per-sequence share
(``decode_step_prefill_tokens_per_sequence``): a few on top, and the share for each sequence
running or waiting, ramped up over the first sequences. Plain Python, no torch."""

from __future__ import annotations

MIN_DECODE_STEP_PREFILL = 16
"""Prompt tokens a step that decodes may take under the per-sequence limit on top of the
per-sequence shares, and never fewer (one KV block): a prompt arriving beside one or two streams is
not cut into many tiny chunks, and one beside 8 streams takes a step fewer (a 190-token prompt at a
share of 7: 72 tokens a step, 3 steps, against 4 of 56). Fewer on top where prompt tokens cost more
(:func:`share_ramp`)."""
FULL_SHARE_SEQUENCES = 8
"""From this many sequences on, each one running or waiting adds the whole per-sequence share of
prompt tokens to a step; below it, a share scaled down in proportion. A decode step of a few
sequences costs about what one of a single sequence does (its matrix products read every weight
whatever the rows), so it is short, and a prompt chunk sized for a larger batch would hold those
streams up for several times its length. On the 2-core Xeon with AMX, a ramp to 16 sequences and
:data:`MIN_DECODE_STEP_PREFILL` as a floor only (28 prompt tokens a step beside 8 streams, not 72)
made their first token's p99 about 1.6 times as long, for an inter-token p99 about a sixth
shorter, and gave 8 streams 10-15% fewer tokens a second."""


def share_ramp(per_seq: int, measured: int) -> tuple[int, int]:
    """``(sequences, tokens)``: the per-sequence share is whole from this many sequences on, and
    a step takes this many prompt tokens on top of it: :data:`FULL_SHARE_SEQUENCES` and
    :data:`MIN_DECODE_STEP_PREFILL`. Where the measured share is below the one taken (a device
    default raised it, and a prompt token costs more beside a decode step than the share
    assumes), the ramp lengthens in proportion and the tokens on top shrink, to none at half
    the share taken: a measured 2 under a default of 4 keeps a ramp to 16 sequences with 16 as
    a floor only. On the 2-core Xeon held to AVX2 or AVX512_BF16 (measured 2), the ramp to 8
    with 16 on top lengthened the inter-token p99 at 8 streams from 81 to 146 ms and from 46 to
    81 ms."""
    if not 0 < measured < per_seq:
        return FULL_SHARE_SEQUENCES, MIN_DECODE_STEP_PREFILL
    ratio = measured / per_seq
    full = min(2 * FULL_SHARE_SEQUENCES, round(FULL_SHARE_SEQUENCES / ratio))
    return full, round(MIN_DECODE_STEP_PREFILL * max(0.0, 2 * ratio - 1))


def step_prompt_tokens(per_seq: int, sequences: int, ramp: tuple[int, int]) -> int:
    """Prompt tokens a step takes beside ``sequences`` running or waiting, under ``ramp``
    (:func:`share_ramp`), never fewer than :data:`MIN_DECODE_STEP_PREFILL`."""
    full, extra = ramp
    return max(MIN_DECODE_STEP_PREFILL, extra + per_seq * sequences * min(sequences, full) // full)
