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
