"""EAGLE and EAGLE-3: a small head that reads the target's hidden states proposes the next tokens.

The head runs one row per position ``p`` of a sequence: the token at ``p + 1`` with the target's
hidden state of ``p`` (:mod:`.eagle_head`). What the engine hands over after each step
(:meth:`EagleProposer.observe`) waits until the next :meth:`EagleProposer.propose`, which runs
the waiting rows of every sequence asking for proposals in one pass; the row of the last token
whose state is known (position ``n - 2`` of ``n`` tokens: the last token has not run) gives the
first proposal. Each further proposal is a row of its own: the token just proposed, with the
head's own output of the row before, at the next position; greedy, mapped from the draft
vocabulary to the target's (EAGLE-3). Those rows' keys and values are scratch: only rows built
from the target's states are kept, so the proposals the target rejects leave nothing behind, and
the next step's states of the accepted tokens take their place, as in vLLM.

What the engine passes to :meth:`EagleProposer.observe`: for ``hidden == "final"`` (EAGLE), the
target's hidden states after its final norm (:meth:`~..models.decoder.DecoderModel.forward`'s
output), ``(rows, hidden_size)``; for ``hidden == "aux"`` (EAGLE-3), the streams entering the
layers in :attr:`EagleProposer.aux_layers` concatenated
(:attr:`~..models.decoder.DecoderModel.aux_hidden` with ``model.aux_layers`` set to them),
``(rows, len(aux_layers) * hidden_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..scheduling.sequence import Sequence
from .eagle_head import EagleHead, HeadKV
from .eagle_weights import load_head

FLUSH_ROWS = 512
"""Waiting rows of one sequence that :meth:`EagleProposer.observe` runs through the head at once
rather than keep (a long prompt whose sequence asks for no proposals for a while)."""
POSITION_MARGIN = 256
"""Rotary positions past the target's table the head has room for (proposals near the end)."""


@dataclass
class _Seq:
    kv: HeadKV
    waiting: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """``(first position, rows)``: the target's states (as the head reads them) not yet run, by position."""
    last: tuple[int, torch.Tensor, torch.Tensor] | None = None
    """The last kept row: its position, the hidden state the next row reads, its LM head input."""

    def cut(self, position: int) -> None:
        """Forget what was kept or waits for ``position`` and after."""
        self.kv.cut(position)
        if self.last is not None and self.last[0] >= position:
            self.last = None
        kept = []
        for start, rows in self.waiting:
            if start < position:
                kept.append((start, rows[: position - start]))
        self.waiting = kept

    def waiting_rows(self) -> int:
        return sum(rows.shape[0] for _, rows in self.waiting)


class EagleProposer:
    def __init__(
        self,
        head_dir: str | Path,
        target: Any,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        method: str | None = None,
        max_len: int | None = None,
    ):
        """The head in ``head_dir`` (EAGLE or EAGLE-3, as its config or tensors say, or as
        ``method`` says) for ``target``, a :class:`~..models.decoder.DecoderModel` with its LM head,
        on ``device`` (the target's by default) in ``dtype`` (the target's by default). ``max_len``:
        the longest sequence (the target's rotary table by default)."""
        device = torch.device(device) if device is not None else target.embed.device
        dtype = dtype or target.dtype
        config, tensors = load_head(head_dir, len(target.layers), target.spec.hidden_size, method)
        max_len = max_len or target.cos.shape[-2]
        self.head = EagleHead(config, tensors, target, device, dtype, max_len + POSITION_MARGIN)
        self.config = config
        self.name = config.method
        self.hidden = "aux" if config.aux_layers else "final"
        self.aux_layers = config.aux_layers
        self.cost_ratio = self.head.cost_ratio()
        self._seqs: dict[int, _Seq] = {}

    def _state(self, seq: Sequence) -> _Seq:
        st = self._seqs.get(seq.seq_id)
        if st is None:
            c = self.config
            kv = HeadKV(c.num_layers, c.num_kv_heads, c.head_dim, self.head.dtype, self.head.device)
            st = self._seqs[seq.seq_id] = _Seq(kv)
        return st

    def observe(self, seq: Sequence, start: int, hidden: Any) -> None:
        st = self._state(seq)
        st.cut(start)
        if hidden.shape[0] == 0:
            return
        st.waiting.append((start, self.head.combine(hidden)))
        if st.waiting_rows() >= FLUSH_ROWS:
            self._advance([(seq, st)])

    def forget(self, seq: Sequence) -> None:
        self._seqs.pop(seq.seq_id, None)

    def _advance(self, items: list[tuple[Sequence, _Seq]]) -> None:
        """Run the waiting rows of these sequences whose next token is known, in one pass, and keep them."""
        ids: list[int] = []
        positions: list[int] = []
        hidden: list[torch.Tensor] = []
        spans: list[tuple[HeadKV, int, int]] = []
        runs: list[tuple[_Seq, list[int]]] = []
        for seq, st in items:
            tokens = seq.token_ids
            st.cut(len(tokens) - 1)  # row p reads token p + 1
            if not st.waiting:
                continue
            mine = [p for start, rows in st.waiting for p in range(start, start + rows.shape[0])]
            ids.extend(tokens[p + 1] for p in mine)
            positions.extend(mine)
            hidden.extend(rows for _, rows in st.waiting)
            st.kv.reserve(st.kv.length + len(mine))
            spans.append((st.kv, st.kv.length, len(mine)))
            runs.append((st, mine))
            st.waiting = []
        if not runs:
            return
        device = self.head.device
        out, head_in = self.head.forward(
            torch.tensor(ids, device=device),
            torch.cat(hidden),
            torch.tensor(positions, device=device),
            spans,
        )
        end = 0
        for st, mine in runs:
            end += len(mine)
            st.kv.keep(mine)
            st.last = (mine[-1], out[end - 1].clone(), head_in[end - 1].clone())

    def propose(self, seqs: list[Sequence], counts: list[int]) -> list[list[int]]:
        proposals: list[list[int]] = [[] for _ in seqs]
        asking = [(i, seq, self._state(seq)) for i, seq in enumerate(seqs) if counts[i] > 0]
        self._advance([(seq, st) for _, seq, st in asking])
        # a sequence proposes from the head's row of its last token with a known state (n - 2)
        live = [
            (i, len(seq.token_ids), st)
            for i, seq, st in asking
            if st.last is not None and st.last[0] == len(seq.token_ids) - 2
        ]
        if not live:
            return proposals
        hidden = torch.stack([st.last[1] for _, _, st in live])  # type: ignore[index]
        head_in = torch.stack([st.last[2] for _, _, st in live])  # type: ignore[index]
        limit = self.head.cos.shape[0]
        for j in range(max(counts[i] for i, _, _ in live)):
            tokens = self.head.tokens(head_in).tolist()
            for (i, _, _), token in zip(live, tokens):
                proposals[i].append(token)
            # the next row: the proposed token at n + j with the head's state of n - 1 + j
            going = [r for r, (i, n, _) in enumerate(live) if len(proposals[i]) < counts[i] and n - 1 + j < limit]
            if not going:
                break
            live = [live[r] for r in going]
            spans = []
            for _, _, st in live:
                st.kv.reserve(st.kv.length + j + 1)
                spans.append((st.kv, st.kv.length + j, 1))
            device = self.head.device
            pick = torch.tensor(going, device=device)
            hidden, head_in = self.head.forward(
                torch.tensor([tokens[r] for r in going], device=device),
                hidden.index_select(0, pick),
                torch.tensor([n - 1 + j for _, n, _ in live], device=device),
                spans,
            )
        return proposals
