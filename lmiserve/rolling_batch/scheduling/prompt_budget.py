"""How many prompt tokens a step takes (:class:`PromptBudget`): the step's token budget, bounded
where sequences decode in it by ``max_decode_step_prefill_tokens`` and under the per-sequence
share (``decode_step_prefill_tokens_per_sequence``) by a few tokens on top and the share for
each sequence running or waiting, ramped up over the first sequences; and how a prompt is cut
into a step's chunk (:func:`chunk`). Plain Python, no torch."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from .sequence import Sequence

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
TAIL_SHARE = 4
"""Under the per-sequence limit, a prompt whose rest exceeds the step's prompt tokens by at most
this share of them (a quarter) is taken whole, within the step's budget and
``max_decode_step_prefill_tokens``: a short tail left for the next step would cost its first
token a whole further step (every stream waits for each step anyway) to spare this one a few
tokens' time."""


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


class PromptBudget:
    """The prompt tokens of a step under the scheduler's limits: ``max_num_batched_tokens``,
    ``max_decode_step_prefill_tokens`` (``cap``) and the per-sequence share (``per_seq``, with
    the share ``measured`` for this CPU: :func:`share_ramp`)."""

    def __init__(self, max_num_batched_tokens: int, cap: int | None, per_seq: int | None, measured: int):
        self.max_num_batched_tokens = max_num_batched_tokens
        self.cap = cap
        self.per_seq = per_seq
        self.ramp = share_ramp(per_seq or 0, measured)

    def _share(self, sequences: int) -> int:
        """Prompt tokens per step under the per-sequence limit."""
        return step_prompt_tokens(self.per_seq or 0, sequences, self.ramp)

    def decode_step(self, sequences: int) -> int:
        """Most prompt tokens a step that also decodes may take beside ``sequences`` running or waiting."""
        limit = self.cap or self.max_num_batched_tokens
        if self.per_seq is not None:
            limit = min(limit, self._share(sequences))
        return limit

    def idle_step(self, running: list[Sequence], waiting: Seq[Sequence]) -> int:
        """Most prompt tokens a step in which nothing decodes may take now: the whole budget, or,
        under the per-sequence limit, the next prompt whole and beyond it the per-sequence share.
        Prompts that arrive together then start one after the other rather than all in one
        step, so they do not finish together, and the prompts that replace them (a closed loop,
        a client that sends its next request when one ends) do not arrive together either: each
        is prefilled in a step or two beside the others' decodes instead of waiting for all of
        them at once."""
        if self.per_seq is None:
            return self.max_num_batched_tokens
        prefilling = [s for s in running if s.num_pending > 1]
        head = prefilling[0].num_pending if prefilling else (waiting[0].num_tokens if waiting else 0)
        return min(self.max_num_batched_tokens, max(self._share(len(running) + len(waiting)), head))

    def limits(
        self, budget: int, decodes: bool, running: list[Sequence], waiting: Seq[Sequence]
    ) -> tuple[int, int, int]:
        """``(budget, hard, tail)`` for the prompt tokens of a step with ``budget`` tokens left:
        the tokens they may take, the bound a prompt's tail taken whole must fit (the step's
        budget and ``cap`` where sequences decode), and that tail (:data:`TAIL_SHARE`)."""
        hard = budget
        if decodes:  # streams that decode wait for this step: it takes a bounded number of prompt tokens
            hard = min(budget, self.cap or budget)
            budget = min(budget, self.decode_step(len(running) + len(waiting)))
        else:
            budget = min(budget, self.idle_step(running, waiting))
        return budget, hard, budget // TAIL_SHARE if self.per_seq is not None else 0


def chunk(pending: int, budget: int, tail: int, hard: int) -> int:
    """Prompt tokens a sequence with ``pending`` of them gets in this step: what is left of the
    step's ``budget``, or all of them when the rest is a tail of at most ``tail`` tokens that
    fits ``hard`` (the step's budget and ``max_decode_step_prefill_tokens``)."""
    if pending <= budget + tail and pending <= hard:
        return pending
    return min(pending, budget)
