"""Prompt lookup: proposals copied from the sequence's own text, no weights.

The last ``n`` tokens (``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``) are looked
for earlier in the prompt and the generated text; where they occur last, the tokens that followed
them there are proposed. Answers that repeat their prompt (rewriting, extracting, editing code)
are then produced several tokens a step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..scheduling.sequence import Sequence


class TokenHistory:
    """A sequence's token ids as a growing numpy array, extended by what was appended since the last
    look (a sequence's tokens only grow)."""

    def __init__(self) -> None:
        self.array = np.zeros(0, dtype=np.int64)
        self.size = 0

    def of(self, tokens: list[int]) -> np.ndarray:
        n = len(tokens)
        if n < self.size:  # recomputed from fewer tokens: start again
            self.size = 0
        if n > self.array.shape[0]:
            grown = np.zeros(max(2 * self.array.shape[0], n, 64), dtype=np.int64)
            grown[: self.size] = self.array[: self.size]
            self.array = grown
        if n > self.size:
            self.array[self.size : n] = tokens[self.size : n]
            self.size = n
        return self.array[:n]


def lookup(tokens: np.ndarray, lo: int, hi: int, count: int) -> list[int]:
    """Up to ``count`` tokens that followed the latest earlier occurrence of the longest suffix of
    ``tokens`` of ``lo`` to ``hi`` tokens; none when no such suffix occurs earlier."""
    length = tokens.shape[0]
    if count <= 0 or length < lo + 1:
        return []
    # candidates: where the last token occurs before the end (the suffix's own place excluded)
    last = np.flatnonzero(tokens[: length - 1] == tokens[-1])
    if last.shape[0] == 0:
        return []
    for n in range(min(hi, length - 1), lo - 1, -1):
        ends = last[last >= n - 1]  # an occurrence ending at e starts at e - n + 1 >= 0
        if ends.shape[0] == 0:
            continue
        if n > 1:
            windows = sliding_window_view(tokens[: length - 1], n)[ends - n + 1]
            ends = ends[(windows == tokens[length - n :]).all(axis=1)]
        if ends.shape[0]:
            start = int(ends[-1]) + 1
            return tokens[start : start + count].tolist()
    return []


class NgramProposer:
    name = "ngram"
    cost_ratio = 0.0
    hidden = ""
    aux_layers: tuple[int, ...] = ()

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.lo, self.hi = prompt_lookup_min, prompt_lookup_max
        self._histories: dict[int, TokenHistory] = {}

    def propose(self, seqs: list[Sequence], counts: list[int]) -> list[list[int]]:
        out = []
        for seq, count in zip(seqs, counts):
            if count <= 0:
                out.append([])
                continue
            history = self._histories.setdefault(seq.seq_id, TokenHistory())
            out.append(lookup(history.of(seq.token_ids), self.lo, self.hi, count))
        return out

    def observe(self, seq: Sequence, start: int, hidden: Any) -> None:
        pass

    def forget(self, seq: Sequence) -> None:
        self._histories.pop(seq.seq_id, None)
