"""Constrained decoding: only tokens that keep the output valid for a grammar can be sampled.

Grammars (a JSON schema, any JSON object, a regular expression, an EBNF grammar, a list of choices,
a structural tag) are compiled once with
xgrammar against the model's tokenizer and cached; every constrained sequence has a matcher
that masks its logits before sampling and advances with each chosen token.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch

from ...wire import GuidedDecoding
from ..scheduling.sequence import Sequence

log = logging.getLogger("lmiserve.engine")

_NATIVE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")
"""xgrammar's native errors start with a time and a source line: ``[09:06:22] /project/cpp/x.cc:83: ``."""


def choice_grammar(choices: list[str]) -> str:
    """EBNF whose only sentences are ``choices``, each a quoted literal."""

    def literal(text: str) -> str:
        escaped = "".join("\\" + c if c in '"\\' else c if 0x20 <= ord(c) != 0x7F else f"\\u{ord(c):04x}" for c in text)
        return f'"{escaped}"'

    return "root ::= " + " | ".join(literal(c) for c in choices)


def error_text(exc: Exception) -> str:
    """``exc``'s message without xgrammar's native prefix (the position it names is kept)."""
    return _NATIVE_PREFIX.sub("", str(exc).strip()).strip()


class GuidedUnavailable(ValueError):
    pass


class GuidedDecoder:
    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._compiler: Any = None
        self._matchers: dict[int, Any] = {}

    def _xgr(self) -> Any:
        try:
            import xgrammar
        except ImportError as exc:
            raise GuidedUnavailable("constrained decoding needs the xgrammar package") from exc
        return xgrammar

    def _compile_cache(self) -> Any:
        if self._compiler is None:
            from transformers import AutoTokenizer

            xgr = self._xgr()
            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            info = xgr.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(self.eos_token_ids) or None
            )
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one decoder per engine, grammars are few
    def _compiled(self, kind: str, value: str) -> Any:
        compiler = self._compile_cache()
        if kind == "json_schema":
            json.loads(value)  # a clear error for a schema that is not JSON
            return compiler.compile_json_schema(value, any_whitespace=False)
        if kind == "json_object":
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if kind == "regex":
            return compiler.compile_regex(value)
        if kind == "grammar":  # EBNF (GBNF) with a ``root`` rule
            return compiler.compile_grammar(value)
        if kind == "choice":  # the choices as a JSON list of strings
            return compiler.compile_grammar(choice_grammar(json.loads(value)))
        if kind == "structural_tag":  # xgrammar's structural tag, as JSON
            return compiler.compile_structural_tag(value)
        raise ValueError(f"unknown constraint {kind!r}")

    def check(self, spec: GuidedDecoding) -> None:
        """Compile now, so that a bad schema is refused when the request arrives."""
        try:
            self._compiled(spec.kind, spec.value)
        except GuidedUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - xgrammar raises various types for bad input
            raise ValueError(f"invalid {spec.kind.replace('_', ' ')}: {error_text(exc)}") from None

    def start(self, seq: Sequence) -> None:
        """The sequence's grammar state, advanced over the output it already holds (ValueError
        when the grammar refuses a token of it). A constraint that starts after a token (``after``)
        starts once the output holds it."""
        spec = seq.params.guided
        if spec is not None and seq.seq_id not in self._matchers:
            output = seq.token_ids[seq.num_prompt_tokens :]
            if spec.after >= 0:
                if spec.after not in output:
                    return
                output = output[output.index(spec.after) + 1 :]
            xgr = self._xgr()
            matcher = xgr.GrammarMatcher(self._compiled(spec.kind, spec.value))
            for token in output:  # a replayed sequence
                if not matcher.accept_token(token):
                    raise ValueError(f"output_ids: token {token} does not follow the {spec.kind.replace('_', ' ')}")
            self._matchers[seq.seq_id] = matcher

    def mask(self, scores: torch.Tensor, seqs: list[Sequence]) -> None:
        """Set the logits of every token a constrained sequence may not produce to -inf."""
        rows = [i for i, s in enumerate(seqs) if s.params.guided is not None and self._constrained(s)]
        if not rows:
            return
        xgr = self._xgr()
        bitmask = xgr.allocate_token_bitmask(len(seqs), self.vocab_size)
        for i in rows:
            self._matchers[seqs[i].seq_id].fill_next_token_bitmask(bitmask, i)
        xgr.apply_token_bitmask_inplace(scores, bitmask.to(scores.device), indices=rows)

    def mask_run(self, scores: torch.Tensor, first: int, seq: Sequence, draft: tuple[int, ...]) -> None:
        """Mask the rows ``first``.. of a verify run (``seq``'s last token, then ``draft``): row ``j``
        as the grammar stands after the first ``j`` proposals. The grammar goes back to where it
        was; rows after a proposal it refuses stay unmasked (that proposal is masked, so never kept)."""
        if not self._constrained(seq):
            return
        matcher = self._matchers[seq.seq_id]
        xgr = self._xgr()
        rows = len(draft) + 1
        bitmask = xgr.allocate_token_bitmask(rows, self.vocab_size)
        filled = advanced = 0
        for j in range(rows):
            matcher.fill_next_token_bitmask(bitmask, j)
            filled += 1
            if j == rows - 1 or matcher.is_terminated() or not matcher.accept_token(draft[j]):
                break
            advanced += 1
        if advanced:
            matcher.rollback(advanced)
        if filled:
            view = scores[first : first + rows]
            xgr.apply_token_bitmask_inplace(view, bitmask.to(scores.device), indices=list(range(filled)))

    def _constrained(self, seq: Sequence) -> bool:
        """Whether the sequence's next token is constrained (its grammar state started here)."""
        if seq.params.guided.after < 0:  # type: ignore[union-attr]
            self.start(seq)
        return seq.seq_id in self._matchers

    def accept(self, seq: Sequence, token: int) -> None:
        matcher = self._matchers.get(seq.seq_id)
        if matcher is not None and not matcher.is_terminated():
            matcher.accept_token(token)
        elif matcher is None and seq.params.guided is not None and token == seq.params.guided.after:
            self.start(seq)  # the thinking ended: the constraint starts with the next token

    def forget(self, seq: Sequence) -> None:
        self._matchers.pop(seq.seq_id, None)
