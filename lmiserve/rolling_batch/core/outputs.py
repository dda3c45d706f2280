"""What a step hands back for each sequence that got a token: the token, why the sequence ends
(if it does), how long it waited, and on its first token what its prompt cost."""

from __future__ import annotations

from ... import wire
from ..scheduling.sequence import Sequence


class OutputBuilder:
    def __init__(self, eos_token_ids: tuple[int, ...], max_model_len: int):
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def finish_reason(self, seq: Sequence, token: int) -> str | None:
        """Why ``seq`` ends with ``token`` (already appended), or None while it goes on."""
        p = seq.params
        if seq.num_generated >= p.min_new_tokens:
            if token in p.stop_token_ids:
                return "stop_sequence"
            if not p.ignore_eos and token in self.eos_token_ids:
                return "eos_token"
        if seq.num_generated >= p.max_new_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def token(
        self,
        seq: Sequence,
        token: int,
        logprob: float,
        top: list[tuple[int, float]] | None,
        batch_size: int,
        step_started: float,
    ) -> wire.SeqDelta:
        """The delta of ``seq``'s newest token (already appended)."""
        delta = wire.SeqDelta(
            request_id=seq.request_id,
            index=seq.index,
            token_ids=[token],
            logprobs=[logprob],
            cumulative_logprob=seq.cumulative_logprob,
            finish_reason=self.finish_reason(seq, token),
            batch_size=batch_size,
            queue_us=queue_us(seq, step_started),
        )
        if top is not None:
            delta.top_logprobs = [[wire.TopLogprob(t, v) for t, v in top]]
        if seq.num_emitted == 1:
            delta.num_prompt_tokens = seq.num_prompt_tokens
            delta.num_cached_tokens = seq.num_cached_prompt_tokens
            if seq.params.prompt_logprobs is not None:
                delta.prompt_logprobs = list(seq.prompt_logprobs)
                if seq.params.prompt_logprobs > 0:
                    delta.prompt_top_logprobs = [
                        [wire.TopLogprob(t, v) for t, v in row] for row in seq.prompt_top_logprobs
                    ]
        return delta


def error_delta(seq: Sequence, error: str, kind: str = "") -> wire.SeqDelta:
    """The last delta of ``seq``, ended by ``error`` (``kind``: :attr:`wire.SeqDelta.error_kind`)."""
    return wire.SeqDelta(
        request_id=seq.request_id, index=seq.index, finish_reason="error", error=error, error_kind=kind
    )


def queue_us(seq: Sequence, step_started: float) -> int:
    """How long the sequence waited for this token: before its first step for the first token it
    emits, then between the step that produced its previous token and this one."""
    if seq.num_emitted == 1:
        waited = (seq.first_scheduled or step_started) - seq.ready_since
    else:
        waited = step_started - seq.ready_since
    return max(0, int(waited * 1e6))
