"""Proposals from a small model with the target's vocabulary, run greedily by the engine's own runner.

The draft runs as the target does (:class:`..runner.model_runner.ModelRunner`: the same device,
dtype, ops and deterministic mode), with a paged KV cache and a :class:`..scheduling.block_manager.
BlockManager` of its own. Each target sequence has a shadow in the draft: its own block table and
the count of its tokens whose keys and values the draft's cache holds.

A call to :meth:`DraftModelProposer.propose` first rolls each shadow back to the longest prefix of
its computed tokens that the target's tokens still share (the target rejected a proposal: the
draft's keys and values past it are stale, and its blocks past it go back), then catches the draft
up on every target token not in its cache, all sequences in one varlen step (a prompt chunk's kind,
the whole prompt the first time; several steps where they hold more than ``chunk_tokens``), takes
the argmax of each sequence's last row, and runs ``counts[i] - 1`` more single-token steps, every
sequence that wants another token in each, greedily. The last proposal is never run through the
draft: the next call catches up on it if the target kept it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..models.architectures import spec_from_config
from ..models.spec import read_config
from ..runner.graphs import GraphBackend
from ..runner.model_runner import ModelRunner
from ..runner.step_inputs import build_step_arrays, device_tensor
from ..runner.warmup import eager_key, warm_up
from ..scheduling.block_manager import BlockManager
from ..scheduling.scheduler import ScheduledSeq, SchedulerOutput
from ..scheduling.sequence import Group, Sequence, Status
from .weight_bytes import step_weight_bytes

if TYPE_CHECKING:
    from ..runner.step_inputs import StepArrays

DEFAULT_CHUNK_TOKENS = 512
"""Most tokens of one catch-up step (all sequences together)."""


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, at most ``limit`` (list
    comparisons of prefixes, halving the range: a prefix that differs makes every longer one
    differ)."""
    limit = min(limit, len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    lo, hi = 0, limit  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class DraftModelProposer:
    """A draft model's greedy continuations (:class:`.proposer.Proposer`)."""

    name = "draft_model"
    hidden = ""
    aux_layers: tuple[int, ...] = ()

    def __init__(
        self,
        model_dir: Path | str,
        *,
        target_vocab_size: int,
        target_weight_bytes: int,
        device: str,
        dtype: torch.dtype,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        ops_name: str = "auto",
        deterministic: bool = False,
        kv_cache_bytes: int | None = None,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        graph_backend: GraphBackend | None = None,
    ):
        """``target_vocab_size``: the target's ``spec.vocab_size`` (a draft with another is refused
        before its weights are read); ``target_weight_bytes``: what a decode step of the target
        reads (:func:`.weight_bytes.step_weight_bytes` of its model). The KV cache holds
        ``max_num_seqs`` sequences of ``max_model_len`` tokens, or what fits in
        ``kv_cache_bytes``. ``graph_backend``: capture the draft's single-token steps as graphs
        (up to ``max_num_seqs`` sequences)."""
        model_dir = Path(model_dir)
        spec = spec_from_config(read_config(model_dir))
        if spec.vocab_size != target_vocab_size:
            raise ValueError(
                f"the draft model {model_dir} has a vocabulary of {spec.vocab_size} tokens, the target's has "
                f"{target_vocab_size}: a draft model must share the target's tokenizer and vocabulary"
            )
        if target_weight_bytes <= 0:
            raise ValueError(f"target_weight_bytes must be positive, got {target_weight_bytes}")
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
        self.model_dir = model_dir
        self.chunk_tokens = chunk_tokens
        self.max_model_len = max_model_len
        self.runner = runner = ModelRunner(
            model_dir, spec, dtype, device, max_model_len, block_size, ops_name, deterministic=deterministic
        )
        per_seq = -(-max_model_len // block_size)
        num_blocks = max_num_seqs * per_seq
        if kv_cache_bytes:
            num_blocks = max(1, kv_cache_bytes // runner.block_bytes)
        runner.allocate_cache(num_blocks)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.weight_bytes = step_weight_bytes(runner.model)
        self.cost_ratio = self.weight_bytes / target_weight_bytes
        """A draft token's cost as a share of a target step at one sequence (both read their weights)."""
        self._shadows: dict[int, Sequence] = {}
        if graph_backend is not None:
            runner.capture_graphs(max_num_seqs, graph_backend)
        if graph_backend is not None or runner.ops.name == "cuda":
            runner.warm_keys |= warm_up(runner, lora=False)

    @classmethod
    def for_target(
        cls,
        model_dir: Path | str,
        target: ModelRunner,
        *,
        max_num_seqs: int,
        kv_cache_bytes: int | None = None,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        graph_backend: GraphBackend | None = None,
    ) -> DraftModelProposer:
        """The draft of ``model_dir`` beside the ``target`` runner: its device, dtype, ops,
        deterministic mode, block size and ``max_model_len``, checked against its vocabulary and
        priced against its weights."""
        return cls(
            model_dir,
            target_vocab_size=target.spec.vocab_size,
            target_weight_bytes=step_weight_bytes(target.model),
            device=target.device,
            dtype=target.dtype,
            max_num_seqs=max_num_seqs,
            max_model_len=target.max_model_len,
            block_size=target.block_size,
            ops_name=target.ops.name,
            deterministic=target.deterministic,
            kv_cache_bytes=kv_cache_bytes,
            chunk_tokens=chunk_tokens,
            graph_backend=graph_backend,
        )

    # --- the protocol ----------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], counts: list[int]) -> list[list[int]]:
        """The draft's greedy continuation of each sequence, ``counts[i]`` tokens long (fewer only
        where ``max_model_len`` ends it; none where the draft's cache has no room for it)."""
        out: list[list[int]] = [[] for _ in seqs]
        active: list[tuple[int, Sequence, int]] = []  # (index in seqs, shadow, tokens wanted)
        for i, (seq, count) in enumerate(zip(seqs, counts)):
            tokens = seq.token_ids
            # the target can check proposals up to position max_model_len - 1
            count = min(count, self.max_model_len - len(tokens))
            if count <= 0 or not tokens:
                continue
            shadow = self._shadow(seq)
            self._rewind(shadow, tokens)
            hold = len(tokens) + count - 1 - shadow.num_computed  # the last proposal is never run
            if not self.blocks.can_append(shadow, hold):
                self.forget(seq)  # the draft's cache is full: no proposals for this one now
                continue
            self.blocks.append_slots(shadow, hold)
            active.append((i, shadow, count))
        if not active:
            return out
        self._catch_up([shadow for _, shadow, _ in active])
        for step in range(1, max(count for _, _, count in active)):
            running = [shadow for _, shadow, count in active if count > step]
            items = [ScheduledSeq(s, 1, s.num_computed, True, True) for s in running]
            hidden = self._forward(items, [])
            for shadow in running:
                shadow.num_computed += 1
            self._append(running, hidden, list(range(len(running))))
        for i, shadow, count in active:
            start = len(seqs[i].token_ids)
            out[i] = shadow.token_ids[start : start + count]
        return out

    def observe(self, seq: Sequence, start: int, hidden: Any) -> None:
        """The draft reads no hidden states of the target."""

    def forget(self, seq: Sequence) -> None:
        shadow = self._shadows.pop(seq.seq_id, None)
        if shadow is not None:
            self.blocks.free(shadow)

    # --- the steps -------------------------------------------------------------------------
    def _shadow(self, seq: Sequence) -> Sequence:
        shadow = self._shadows.get(seq.seq_id)
        if shadow is None:
            group = Group(seq.request_id, seq.params)
            shadow = Sequence(group, seq.index, [], seq.num_prompt_tokens, status=Status.RUNNING)
            group.sequences.append(shadow)
            self._shadows[seq.seq_id] = shadow
        return shadow

    def _rewind(self, shadow: Sequence, tokens: list[int]) -> None:
        """Keep the computed tokens the target still has (not its last one: the proposals start
        from its logits), give back the blocks past them, and take on the target's tokens."""
        keep = common_prefix(shadow.token_ids, tokens, min(shadow.num_computed, len(tokens) - 1))
        shadow.num_computed = keep
        self.blocks.trim(shadow)
        del shadow.token_ids[keep:]
        shadow.token_ids.extend(tokens[keep:])

    def _catch_up(self, shadows: list[Sequence]) -> None:
        """Run every shadow's tokens not in the cache, at most ``chunk_tokens`` a step; each
        sequence's first proposal comes from its last row."""
        pending = list(shadows)
        while pending:
            budget = self.chunk_tokens
            taken: list[tuple[Sequence, int]] = []
            for shadow in pending:
                if budget == 0:
                    break
                take = min(shadow.num_pending, budget)
                budget -= take
                taken.append((shadow, take))
            # decodes (runs of one token) come first in a step, as the scheduler orders them
            taken.sort(key=lambda st: st[1] != 1)
            items = [ScheduledSeq(s, n, s.num_computed, n == s.num_pending, n == 1) for s, n in taken]
            decodes = [item for item in items if item.decode]
            hidden = self._forward(decodes, [item for item in items if not item.decode])
            ends, rows, row = [], [], 0
            for item in items:
                row += item.num_tokens
                item.seq.num_computed += item.num_tokens
                if item.samples:
                    ends.append(item.seq)
                    rows.append(row - 1)
            pending = [s for s in pending if s.num_pending > 0]
            self._append(ends, hidden, rows)

    def _append(self, shadows: list[Sequence], hidden: torch.Tensor, rows: list[int]) -> None:
        """Each shadow's greedy next token, from its row of the step's hidden states."""
        if not shadows:
            return
        selected = hidden.index_select(0, device_tensor(rows, torch.long, self.runner.device))
        tokens = self.runner.model.logits(selected).argmax(dim=-1).tolist()
        for shadow, token in zip(shadows, tokens):
            shadow.token_ids.append(int(token))

    def _forward(self, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq]) -> torch.Tensor:
        """Hidden states of every token of the step, decodes first: from a captured graph when one
        fits, else eagerly."""
        runner = self.runner
        arrays: StepArrays = build_step_arrays(
            SchedulerOutput(decodes=decodes, prefills=prefills), runner.block_size, mark_generated=False
        )
        graphs = runner.graphs
        if graphs is not None and graphs.fits(arrays):
            runner.steps[("decode", graphs.bucket_for(arrays.num_seqs))] += 1
            return graphs.run(arrays)
        runner.steps[eager_key(arrays)] += 1
        return runner.run_eager(arrays)

    # --- accounting --------------------------------------------------------------------------
    @property
    def num_shadows(self) -> int:
        return len(self._shadows)

    def close(self) -> None:
        """Drop every shadow (their blocks go back)."""
        for shadow in self._shadows.values():
            self.blocks.free(shadow)
        self._shadows.clear()
