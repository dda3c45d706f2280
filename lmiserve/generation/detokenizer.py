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


def added_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the special and added tokens (those a decode keeps as separate pieces)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    try:
        ids.update((tokenizer.get_added_vocab() or {}).values())
    except Exception:  # noqa: BLE001 - a tokenizer without an added vocabulary
        pass
    return frozenset(ids)


class IncrementalDetokenizer:
    """``spaces_between_special_tokens`` (vLLM's and transformers' parameter): None decodes as
    the tokenizer does; True or False joins the text around each kept special or added token
    with a space or with nothing."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool | None = None,
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces = spaces_between_special_tokens
        self._added = added_token_ids(tokenizer) if spaces_between_special_tokens is not None else frozenset()
        context = list(prompt_ids[-CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        if self.spaces is None or not self._added.intersection(ids):
            return self.tokenizer.decode(
                ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
            )
        return decode_pieces(self.tokenizer, ids, self._added, self.skip_special_tokens, self.spaces)

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


def decode_pieces(tokenizer: Any, ids: Sequence[int], added: frozenset[int], skip_special: bool, spaces: bool) -> str:
    """Decode the runs of ordinary tokens apart from each special or added token, then join the
    pieces with a space (``spaces``) or with nothing, as transformers' slow tokenizers do."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pieces: list[str] = []
    run: list[int] = []
    for i in ids:
        if i in added:
            if skip_special and i in special:
                continue
            if run:
                pieces.append(tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False))
                run = []
            pieces.append(tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        else:
            run.append(i)
    if run:
        pieces.append(tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False))
    return (" " if spaces else "").join(pieces)
