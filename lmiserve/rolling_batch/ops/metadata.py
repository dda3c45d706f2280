"""What the attention ops are told about a step: where each sequence's tokens are."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedAttentionInputs:
    """Every sequence of a step at once, decodes first (a decode is a run of one query token).

    Sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``, the last of its
    ``seq_lens[s]`` tokens, whose blocks are row ``s`` of ``block_tables``. The host copies
    size kernel launches and feed the contract check without reading the device.
    """

    block_tables: torch.Tensor
    """int32 ``(S, W)``."""
    cu_q_lens: torch.Tensor
    """int32 ``(S + 1,)``."""
    seq_lens: torch.Tensor
    """int32 ``(S,)``."""
    max_q_len: int
    host_cu_q_lens: list[int]
    host_seq_lens: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.host_seq_lens)


@dataclass
class LoraStep:
    """Which adapter slot each token of a step uses: runs of rows ``(slot, first, end)``, in row
    order; rows in no run (requests without an adapter) get nothing added."""

    segments: list[tuple[int, int, int]]
    device: torch.device | str = "cpu"
    _subsets: dict[frozenset[int], LoraStep | None] | None = None
    _tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    _rows: torch.Tensor | None = None
    _host: torch.Tensor | None = None
    _split: tuple[int, LoraStep | None, LoraStep | None] | None = None
    checked: tuple[int, int] | None = None
    """The (rows, slots) the contract check passed these runs for."""

    @property
    def max_rows(self) -> int:
        return max((end - first for _, first, end in self.segments), default=0)

    @property
    def num_rows(self) -> int:
        return sum(end - first for _, first, end in self.segments)

    def only(self, slots: set[int]) -> LoraStep | None:
        """The runs whose slot is in ``slots`` (None if there are none); worked out once per step."""
        key = frozenset(slots)
        if self._subsets is None:
            self._subsets = {}
        if key not in self._subsets:
            kept = [s for s in self.segments if s[0] in key]
            self._subsets[key] = LoraStep(kept, self.device) if kept else None
        return self._subsets[key]

    def split(self, rows: int) -> tuple[LoraStep | None, LoraStep | None]:
        """``(runs shorter than rows, the others)``, each None when empty; worked out once."""
        if self._split is None or self._split[0] != rows:
            short = [s for s in self.segments if s[2] - s[1] < rows]
            long = [s for s in self.segments if s[2] - s[1] >= rows]
            self._split = (
                rows,
                LoraStep(short, self.device) if short else None,
                LoraStep(long, self.device) if long else None,
            )
        return self._split[1], self._split[2]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """int32 ``(slots, firsts, ends)`` of the runs, on the device (made once)."""
        if self._tensors is None:
            flat = torch.tensor([v for seg in self.segments for v in seg], dtype=torch.int32).view(-1, 3).t()
            flat = flat.contiguous().to(self.device)
            self._tensors = (flat[0], flat[1], flat[2])
        return self._tensors

    def host_runs(self) -> torch.Tensor:
        """int64 ``(runs, 3)`` on the CPU: each run's slot, first row and end row (made once)."""
        if self._host is None:
            self._host = torch.tensor(self.segments, dtype=torch.int64).view(-1, 3)
        return self._host

    def rows(self) -> torch.Tensor:
        """int64 indices of the rows in the runs, run after run, on the device (made once)."""
        if self._rows is None:
            index = torch.cat([torch.arange(first, end) for _, first, end in self.segments])
            self._rows = index.to(self.device)
        return self._rows
