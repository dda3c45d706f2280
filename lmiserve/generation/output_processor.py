"""From the engine's token ids to text: incremental detokenization, stop strings, log-probabilities.

One :class:`OutputProcessor` per request, in the API process. It keeps every streamed piece
consistent with the final text: each token's ``text`` is exactly what that token added, so
the pieces always join to ``generated_text``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from ..wire import SeqDelta, TopLogprob
from .detokenizer import IncrementalDetokenizer, decode_step
from .reasoning import ReasoningParser
from .request import GenerationRequest, RequestOutput, SequenceOutput, TokenOutput
from .stop_strings import StopAutomaton, StopStringMatcher


class OutputProcessor:
    def __init__(self, tokenizer: Any, request_id: str, request: GenerationRequest, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.request = request
        count = max(request.params.best_of, request.params.n, 1)
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.output = RequestOutput(
            request_id=request_id,
            prompt=request.prompt,
            prompt_token_ids=prompt_ids,
            sequences=[SequenceOutput(index=i) for i in range(count)],
            seed=request.params.seed,
            arrival=time.monotonic(),
            adapter=request.adapter or "",
        )
        self._detok = [
            IncrementalDetokenizer(
                tokenizer, prompt_ids, request.skip_special_tokens, request.spaces_between_special_tokens
            )
            for _ in range(count)
        ]
        self._decoded: list[deque[tuple[SeqDelta, list[str]]]] = [deque() for _ in range(count)]
        """Per sequence, the text of deltas decoded when their step arrived (:func:`detokenize_step`)."""
        stops = StopAutomaton(request.stop)  # compiled once, shared by every sequence
        self._stops = [StopStringMatcher(stops, request.include_stop_str_in_output) for _ in range(count)]
        thinking = ReasoningParser(request.drop_thinking) if request.drop_thinking else None
        self._thinking = [thinking.stream() for _ in range(count)] if thinking is not None else None
        """Per sequence, the reasoning parser that leaves the thinking out of the text, if any."""

    def _answer(self, index: int, piece: str, last: bool = False) -> str:
        """The answer's part of ``piece`` (all of it unless the thinking is left out)."""
        if self._thinking is None:
            return piece
        stream = self._thinking[index]
        answer = stream.feed(piece)[1]
        return answer + stream.finish()[1] if last else answer

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _alternatives(self, top: list[TopLogprob]) -> list[TokenOutput]:
        out = []
        for t in top:
            text = self._text(t.token_id)
            out.append(TokenOutput(t.token_id, text, t.logprob, t.token_id in self.special, token=text))
        return out

    def _prompt_details(self, delta: SeqDelta) -> None:
        if delta.prompt_logprobs is None or self.output.prompt_tokens is not None:
            return
        ids = self.output.prompt_token_ids
        tops = delta.prompt_top_logprobs or []
        tokens = []
        for i, token_id in enumerate(ids):
            lp = delta.prompt_logprobs[i] if i < len(delta.prompt_logprobs) else None
            top = self._alternatives(tops[i - 1]) if 0 < i <= len(tops) else None
            text = self._text(token_id)
            tokens.append(TokenOutput(token_id, text, lp, token_id in self.special, top, token=text))
        self.output.prompt_tokens = tokens

    def apply(self, delta: SeqDelta) -> bool:
        """Apply one engine delta. Returns True when a stop string ended this sequence here
        (the engine must then be told to stop generating it)."""
        out = self.output
        if delta.error is not None:
            out.error = delta.error
            out.error_kind = delta.error_kind
            for seq in out.sequences:
                if not seq.finished:
                    seq.finish_reason = "error"
            out.finished_at = time.monotonic()
            return False
        seq = out.sequences[delta.index]
        out.last_index = delta.index
        seq.new_tokens = []
        decoded = self._decoded[delta.index]
        if seq.finished:
            decoded.clear()
            return False
        pieces = decoded.popleft()[1] if decoded and decoded[0][0] is delta else None
        if out.first_token_at is None:
            out.first_token_at = time.monotonic()
        if delta.num_prompt_tokens:
            out.num_cached_tokens = max(out.num_cached_tokens, delta.num_cached_tokens)
        self._prompt_details(delta)
        if delta.token_ids and not delta.batch_size:
            out.step_stats = False
        elif delta.token_ids:  # a step's entries once, however many sequences it moved; a token each
            missing = len(seq.tokens) + len(delta.token_ids) - len(out.batch_sizes)
            for i in range(missing):
                out.batch_sizes.append(delta.batch_size)
                out.queue_us.append(delta.queue_us if i == 0 else 0)
        detok, stops = self._detok[delta.index], self._stops[delta.index]
        stopped_here = False
        for i, token_id in enumerate(delta.token_ids):
            piece = stops.feed(pieces[i] if pieces is not None else detok.add([token_id]))
            piece = self._answer(delta.index, piece, stops.matched is not None)
            top = self._alternatives(delta.top_logprobs[i]) if delta.top_logprobs else None
            lp = delta.logprobs[i] if i < len(delta.logprobs) else None
            token = TokenOutput(token_id, piece, lp, token_id in self.special, top)
            if self.request.token_strings:
                token.token = self._text(token_id)
            seq.tokens.append(token)
            seq.new_tokens.append(token)
            seq.text += piece
            if stops.matched is not None:
                seq.finish_reason = "stop_sequence"
                seq.stop_reason = stops.matched
                stopped_here = True
                break
        seq.cumulative_logprob = delta.cumulative_logprob
        if not stopped_here and delta.finish_reason is not None:
            tail = self._answer(delta.index, stops.feed(detok.flush()) + stops.flush(), last=True)
            if tail:
                if seq.new_tokens:
                    seq.new_tokens[-1].text += tail
                seq.text += tail
            seq.finish_reason = delta.finish_reason
            if delta.finish_reason == "stop_sequence" and seq.tokens:
                seq.stop_reason = seq.tokens[-1].id  # a stop token id
        if out.finished:
            out.finished_at = time.monotonic()
        return stopped_here


def detokenize_step(pairs: Iterable[tuple[OutputProcessor, SeqDelta]]) -> None:
    """The text of one engine step's tokens for every sequence at once (one tokenizer call per
    round rather than two per token), kept for :meth:`OutputProcessor.apply`. Deltas must come
    in the order the engine sent them. Each sequence's tokens are decoded in order, a round
    taking the next token of every sequence, so a delta decoded here gets exactly the text
    ``apply`` would have decoded."""
    queues: dict[tuple[int, int], list[tuple[IncrementalDetokenizer, int, list[str]]]] = {}
    for processor, delta in pairs:
        if delta.error is not None or not delta.token_ids or processor.output.sequences[delta.index].finished:
            continue
        pieces: list[str] = []
        processor._decoded[delta.index].append((delta, pieces))
        detok = processor._detok[delta.index]
        queue = queues.setdefault((id(processor), delta.index), [])
        queue.extend((detok, token, pieces) for token in delta.token_ids)
    for r in range(max(map(len, queues.values()), default=0)):
        items = [q[r] for q in queues.values() if r < len(q)]
        for (_, _, pieces), piece in zip(items, decode_step([(d, t) for d, t, _ in items])):
            pieces.append(piece)
