"""Incremental detokenization that keeps spaces and multi-byte characters right.

Decoding each new token alone loses the leading space that SentencePiece-style tokenizers
attach to a word, and splits multi-byte characters across tokens. Instead the decoder keeps a
short window of earlier tokens (starting with the end of the prompt), decodes the window with
and without the new tokens, and emits the difference — holding it back while it ends in an
incomplete character (U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CONTEXT_TOKENS = 5
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        context = list(prompt_ids[-CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def add(self, token_ids: Sequence[int]) -> str:
        """Feed new token ids; returns the text they complete (may be empty)."""
        self._ids.extend(token_ids)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            delta = full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            # keep the window short
            if self._prefix_offset > 64:
                drop = self._prefix_offset
                self._ids = self._ids[drop:]
                self._prefix_offset -= drop
                self._read_offset -= drop
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """Text still held back (an incomplete character at the very end), emitted as is."""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix):
            delta = full[len(prefix) :]
            self._prefix_offset = self._read_offset = len(self._ids)
            self.text += delta
            return delta
        return ""
