"""Incremental detokenization that keeps spaces and multi-byte characters right.

Decoding each new token alone loses the leading space that SentencePiece-style tokenizers
attach to a word, and splits multi-byte characters across tokens. Instead the decoder keeps a
short window of earlier tokens (starting with the end of the prompt), decodes the window with
and without the new tokens, and emits the difference — holding it back while it ends in an
incomplete character (U+FFFD).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
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
        return self._advance(prefix, self._decode(self._ids[self._prefix_offset :]))

    def windows(self, token_id: int) -> tuple[list[int], list[int]] | None:
        """The two windows of ids that ``add([token_id])`` decodes (before and with the token), for
        a caller that decodes many sequences' windows at once; None when this detokenizer must
        decode itself (special tokens joined by :func:`decode_pieces`)."""
        prefix = self._ids[self._prefix_offset : self._read_offset]
        full = self._ids[self._prefix_offset :]
        full.append(token_id)
        if self.spaces is not None and self._added.intersection(full):
            return None
        return prefix, full

    def add_decoded(self, token_id: int, prefix: str, full: str) -> str:
        """``add([token_id])`` given the decoded :meth:`windows`."""
        self._ids.append(token_id)
        return self._advance(prefix, full)

    def _advance(self, prefix: str, full: str) -> str:
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


def batch_decoder(tokenizer: Any) -> Callable[[list[list[int]], bool], list[str]] | None:
    """One call that decodes many id lists exactly as ``tokenizer.decode`` does each (without
    clean-up), straight through the Rust tokenizer behind a transformers tokenizer that adds
    nothing of its own to decoding, without transformers' per-call work; None for any other
    tokenizer. Each list is decoded on this thread: the Rust ``decode_batch`` hands the lists to
    a thread pool, which on cores the engine keeps busy took about 3 ms a call against 15 us."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "decode"):
        return None
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # an older transformers
        return None
    cls = type(tokenizer)
    if not isinstance(tokenizer, TokenizersBackend) or any(
        getattr(cls, name) is not getattr(TokenizersBackend, name) for name in ("decode", "_decode")
    ):
        return None
    decode = backend.decode
    return lambda lists, skip: [decode(ids, skip_special_tokens=skip) for ids in lists]


_DECODERS: weakref.WeakKeyDictionary[Any, Callable[[list[list[int]], bool], list[str]] | None] = (
    weakref.WeakKeyDictionary()
)


def _decoder_of(tokenizer: Any) -> Callable[[list[list[int]], bool], list[str]] | None:
    """:func:`batch_decoder` of ``tokenizer``, worked out once per tokenizer."""
    try:
        return _DECODERS[tokenizer]
    except KeyError:
        decoder = _DECODERS[tokenizer] = batch_decoder(tokenizer)
        return decoder
    except TypeError:  # a tokenizer that cannot be weakly referenced
        return batch_decoder(tokenizer)


def decode_step(items: Sequence[tuple[IncrementalDetokenizer, int]]) -> list[str]:
    """``detok.add([token])`` for each pair, with the decodes of every detokenizer that shares a
    tokenizer done in one call: one engine step's text for all its sequences at once. Each
    detokenizer appears at most once."""
    pieces: list[str | None] = [None] * len(items)
    groups: dict[tuple[int, bool], list[tuple[int, list[int], list[int]]]] = {}
    decoders: dict[int, Callable[[list[list[int]], bool], list[str]] | None] = {}
    for k, (detok, token) in enumerate(items):
        key = id(detok.tokenizer)
        if key not in decoders:
            decoders[key] = _decoder_of(detok.tokenizer)
        windows = detok.windows(token) if decoders[key] is not None else None
        if windows is None:
            pieces[k] = detok.add([token])
        else:
            groups.setdefault((key, detok.skip_special_tokens), []).append((k, *windows))
    for (key, skip), group in groups.items():
        lists = [ids for _, prefix, full in group for ids in (prefix, full)]
        texts = decoders[key](lists, skip)  # type: ignore[misc]
        for n, (k, _, _) in enumerate(group):
            detok, token = items[k]
            pieces[k] = detok.add_decoded(token, texts[2 * n], texts[2 * n + 1])
    return pieces  # type: ignore[return-value]
