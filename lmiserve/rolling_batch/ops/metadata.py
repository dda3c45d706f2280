"""What the ops are told about a step: where each token's key and value go, where each
sequence's query rows are, and which adapter each row uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PagedAttentionInputs:
    """Every sequence of a step at once, decodes first (a decode is a run of one query token).

    Sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``, the last of its
    ``seq_lens[s]`` tokens, whose blocks are row ``s`` of ``block_tables``. The host copies
    size kernel launches and feed the contract check without reading the device. Ops that run
    decodes and prompt chunks in kernels of their own take them apart with :meth:`parts`.
    A captured device graph replays its launches as they were captured: there a launch may
    depend on ``max_q_len`` and the tensors' shapes, never on the host copies or ``num_decodes``
    (:mod:`..runner.mixed_graphs`).
    """

    block_tables: torch.Tensor
    """int32 ``(S, W)``."""
    cu_q_lens: torch.Tensor
    """int32 ``(S + 1,)``."""
    seq_lens: torch.Tensor
    """int32 ``(S,)``."""
    max_q_len: int
    """At least the longest run of query rows: the longest itself in an eager step, the
    bucket's bound in a captured one (the launch is sized by it)."""
    host_cu_q_lens: list[int]
    host_seq_lens: list[int]
    num_decodes: int = 0
    """The leading sequences that decode (one query row each)."""
    generated: GeneratedRows | None = None
    """Prompt rows that hold generated tokens, attended again as decodes (:mod:`.generated_rows`
    finds them; :meth:`.reference.ReferenceOps.attention` attends them)."""
    _parts: tuple[DecodeRows, PromptRows] | None = field(default=None, repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.host_seq_lens)

    @classmethod
    def of(
        cls, block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor, num_decodes: int | None = None
    ) -> PagedAttentionInputs:
        """From device tensors alone (tests, tools): the host copies are read from them once;
        unless said otherwise, the leading sequences with one query row count as decodes."""
        cu, lens = cu_q_lens.tolist(), seq_lens.tolist()
        runs = [b - a for a, b in zip(cu, cu[1:])]
        if num_decodes is None:
            num_decodes = next((i for i, n in enumerate(runs) if n != 1), len(runs))
        return cls(block_tables, cu_q_lens, seq_lens, max(runs, default=0), cu, lens, num_decodes)

    @classmethod
    def one_decode_per_row(cls, block_tables: torch.Tensor, lens: list[int]) -> PagedAttentionInputs:
        """Row ``i`` attended as a decode of a sequence with ``block_tables[i]`` and ``lens[i]``
        tokens (a prompt row on its own: its position + 1)."""
        n, device = len(lens), block_tables.device
        return cls(
            block_tables=block_tables,
            cu_q_lens=torch.arange(n + 1, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
            max_q_len=1,
            host_cu_q_lens=list(range(n + 1)),
            host_seq_lens=lens,
            num_decodes=n,
        )

    def parts(self) -> tuple[DecodeRows, PromptRows]:
        """The decodes (rows ``0:num_decodes``) and the prompt chunks (the rows after them), each
        with its own tables and lengths; worked out once per step (every layer asks)."""
        if self._parts is None:
            nd = self.num_decodes
            decodes = DecodeRows(nd, self.block_tables[:nd], self.seq_lens[:nd])
            cu = self.cu_q_lens[nd:] - nd if nd else self.cu_q_lens
            prompts = PromptRows(self.num_seqs - nd, self.block_tables[nd:], cu, self.seq_lens[nd:])
            self._parts = (decodes, prompts)
        return self._parts


@dataclass
class GeneratedRows:
    """The query rows of a step's prompt chunks that hold generated tokens, as decodes."""

    rows: torch.Tensor
    """int64 ``(G,)``: the rows, in step order."""
    paged: PagedAttentionInputs
    """One decode per row: its sequence's block table, its position + 1 as its length."""


@dataclass
class DecodeRows:
    """The decodes of a step: query row ``s`` is the last token of sequence ``s``."""

    num_seqs: int
    block_tables: torch.Tensor
    seq_lens: torch.Tensor


@dataclass
class PromptRows:
    """The prompt chunks of a step, their query rows counted from the first chunk's."""

    num_seqs: int
    block_tables: torch.Tensor
    cu_q_lens: torch.Tensor
    seq_lens: torch.Tensor


@dataclass
class AttentionMetadata:
    """Where each token of a step goes and what it attends to (decode tokens come first)."""

    slot_mapping: torch.Tensor
    paged: PagedAttentionInputs
    lora: LoraStep | None = None
    """The step's runs of tokens per adapter slot, when some request uses an adapter."""


LORA_MAX_SPLIT_K = 8
"""The most parts the LoRA shrink splits its inner dimension into: a workspace keeps this many
partial sums per row and column (:mod:`.triton_kernels.lora`)."""


@dataclass
class LoraIndex:
    """A step's adapter rows as the device kernels read them: segment ``i`` adds slot
    ``slots[i]``'s update to the rows ``rows[firsts[i]:ends[i]]`` (the step's adapted rows listed
    slot by slot, so one segment per slot however the requests are ordered). The segment arrays
    have a fixed length, a graph's or the step's number of slots; unused segments are empty
    (``first == end``) and rows in no segment (requests without an adapter, a bucket's padding)
    get nothing added. ``max_rows`` bounds a segment's rows on the host: it sizes the launches."""

    slots: torch.Tensor
    """int32 ``(segments,)``."""
    firsts: torch.Tensor
    """int32 ``(segments,)``."""
    ends: torch.Tensor
    """int32 ``(segments,)``."""
    rows: torch.Tensor
    """int32: row indices into the step's tokens, slot by slot."""
    max_rows: int
    workspace: torch.Tensor | None = None
    """fp32 scratch for the kernels' partial sums: reused by every projection of the step (a
    captured graph's is allocated once with its buffers)."""

    def scratch(self, numel: int) -> torch.Tensor:
        """The first ``numel`` floats of the workspace, allocated (or grown) on first need."""
        if self.workspace is None or self.workspace.numel() < numel:
            self.workspace = torch.empty(numel, dtype=torch.float32, device=self.rows.device)
        return self.workspace[:numel]


@dataclass
class LoraStep:
    """Which adapter slot each token of a step uses: runs of rows ``(slot, first, end)``, in row
    order; rows in no run (requests without an adapter) get nothing added. ``index`` is the same
    on the device for kernels that read it (:class:`LoraIndex`); it covers every slot of the
    step, so :meth:`only` keeps it whole (a slot that leaves a projection alone has zeros there)."""

    segments: list[tuple[int, int, int]]
    device: torch.device | str = "cpu"
    index: LoraIndex | None = None
    captured: bool = False
    """A captured graph's: every projection gets its LoRA launches, whatever the step holds."""
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
        """The runs whose slot is in ``slots`` (None if there are none, unless :attr:`captured`);
        worked out once per step."""
        key = frozenset(slots)
        if self._subsets is None:
            self._subsets = {}
        if key not in self._subsets:
            kept = [s for s in self.segments if s[0] in key]
            keep = kept or self.captured
            self._subsets[key] = LoraStep(kept, self.device, self.index, self.captured) if keep else None
        return self._subsets[key]

    def reset(self, segments: list[tuple[int, int, int]]) -> None:
        """New runs for the same (captured) step: what was worked out from the old ones is dropped."""
        self.segments = segments
        self._subsets = self._tensors = self._rows = self._host = self._split = None
        self.checked = None

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
        """int32 ``(slots, firsts, ends)`` of the runs, on the device (made once), each 16-byte aligned."""
        if self._tensors is None:
            runs = len(self.segments)
            # rows padded to a multiple of 4: each view starts 16-byte aligned whatever the runs
            flat = torch.zeros((3, -(-runs // 4) * 4), dtype=torch.int32)
            flat[:, :runs] = torch.tensor(self.segments, dtype=torch.int32).view(-1, 3).t()
            flat = flat.to(self.device)
            self._tensors = (flat[0, :runs], flat[1, :runs], flat[2, :runs])
        return self._tensors

    def device_index(self) -> LoraIndex:
        """:attr:`index`, or one made from the runs (each run a segment; made once) where the step
        came without it (ops called directly)."""
        if self.index is None:
            runs = len(self.segments)
            slots, firsts, ends = self.tensors()
            lengths = torch.tensor([end - first for _, first, end in self.segments], dtype=torch.int32)
            bounds = torch.zeros(runs + 1, dtype=torch.int32)
            torch.cumsum(lengths, 0, out=bounds[1:])
            bounds = bounds.to(self.device)
            rows = self.rows().to(torch.int32)
            self.index = LoraIndex(slots, bounds[:runs], bounds[1:], rows, self.max_rows)
        return self.index

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
