"""Which sequences run in the next step, and how many of their tokens.

Every step has a token budget (``max_num_batched_tokens``). Running sequences that decode
(one token each) go first, then running sequences still prefilling continue with a chunk of
their prompt, then waiting sequences are admitted in arrival order while the budget, the
running-sequence limit and the free KV blocks allow; a long prompt is prefilled in chunks
across steps alongside the decodes. A step in which sequences decode takes at most
``max_decode_step_prefill_tokens`` prompt tokens (their next token waits for the whole step), and
with ``decode_step_prefill_tokens_per_sequence`` :data:`~.prompt_budget.MIN_DECODE_STEP_PREFILL` and that many per
sequence running or waiting (in proportion fewer below :data:`~.prompt_budget.FULL_SHARE_SEQUENCES` sequences):
a few streams are held up only briefly by a prompt, while a
full batch, whose requests also arrive more often, prefills in larger chunks and so in fewer
steps; a prompt's rest within a quarter of that share (:data:`~.prompt_budget.TAIL_SHARE`) is not cut off. A step without decodes delays no stream: it takes the whole budget, or, under the
per-sequence limit, the next prompt whole and the per-sequence share beyond it, so that prompts
arriving together start one after the other instead of decoding (and ending) in step. A request for a LoRA adapter joins only when its adapter has
a device slot (at most ``max_loras`` adapters per step); it waits otherwise, and others go ahead. When the cache runs out, the most recently admitted
running sequence is preempted: its blocks are freed and it goes back to the front of the
waiting queue, to be recomputed later (its prefix is likely still cached). Running out of
cache is never an error. A waiting request whose deadline has passed is never scheduled: it
leaves the queue at the next step (``SchedulerOutput.expired``).

Plain Python, no torch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .block_manager import BlockManager
from .prompt_budget import PromptBudget, chunk
from .sequence import Group, Sequence, Status
from .step_batch import ScheduledSeq, SchedulerOutput

__all__ = ["ScheduledSeq", "Scheduler", "SchedulerConfig", "SchedulerOutput"]


@dataclass(frozen=True)
class SchedulerConfig:
    """The limits of a step (the engine's configuration names the settings behind them)."""

    max_num_seqs: int
    """Most sequences running at once."""
    max_num_batched_tokens: int
    """Most tokens in a step (raised to ``max_num_seqs``: every running sequence decodes in every step)."""
    max_model_len: int
    max_prefill_seqs: int | None = None
    """Most sequences prefilled in one step (None: the token budget decides)."""
    max_decode_step_prefill_tokens: int | None = None
    """Most prompt tokens a step takes while sequences decode in it (None: the budget's), so that
    running streams wait at most that long for their next token."""
    decode_step_prefill_tokens_per_sequence: int | None = None
    """In such a step, also at most this many prompt tokens per sequence running or waiting
    (None: no such limit)."""
    measured_share: int = 0
    """The per-sequence share measured for this CPU (0: none), where it is below the one taken:
    prompt tokens cost that much more beside a decode step than the share assumes, so the share is
    ramped over more sequences and fewer tokens come on top of it (:func:`.prompt_budget.share_ramp`)."""


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        adapters: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``adapters``: the LoRA adapters' book (``lora.adapters.AdapterBook``), when LoRA is on;
        ``clock``: the time requests' deadlines are compared with."""
        self.clock = clock
        self.config = config
        self.blocks = block_manager
        self.adapters = adapters
        self.max_prefill_seqs = config.max_prefill_seqs or config.max_num_seqs
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = max(config.max_num_batched_tokens, config.max_num_seqs)
        self.max_model_len = config.max_model_len
        self.prompt_budget = PromptBudget(
            self.max_num_batched_tokens,
            config.max_decode_step_prefill_tokens,
            config.decode_step_prefill_tokens_per_sequence,
            config.measured_share,
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # --- queues ---------------------------------------------------------------------------
    def add(self, group: Group) -> None:
        for seq in group.sequences:
            seq.status = Status.WAITING
            self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.finished:
            return
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.blocks.free(seq)
        self._release_slot(seq.group)

    # --- one step ------------------------------------------------------------------------
    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self._release_slot(seq.group)

    # --- adapters -------------------------------------------------------------------------
    def _take_slot(self, group: Group) -> bool:
        """The request's adapter is in a device slot (now held by the request), or it must wait."""
        if group.adapter is None or group.holds_slot:
            return True
        group.holds_slot = self.adapters.acquire(group.adapter)
        return group.holds_slot

    def _release_slot(self, group: Group) -> None:
        if group.holds_slot and not any(s.status is Status.RUNNING for s in group.sequences):
            group.holds_slot = False
            self.adapters.release(group.adapter)

    @staticmethod
    def _slot_of(item: ScheduledSeq) -> int:
        adapter = item.seq.group.adapter
        return -1 if adapter is None else adapter.slot

    def _victims(self, protected: set[int]) -> list[Sequence]:
        """Sequences that may be preempted: not scheduled this step, not part of a beam search
        (whose beams advance together)."""
        return [s for s in self.running if s.seq_id not in protected and s.group.beam is None]

    def _make_room(self, seq: Sequence, num_tokens: int, out: SchedulerOutput, protected: set[int]) -> bool:
        """Preempt the newest running sequences until ``seq`` can grow; False if ``seq`` itself went."""
        while not self.blocks.can_append(seq, num_tokens):
            victims = self._victims(protected)
            victim = victims[-1] if victims else seq
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _schedule_beams(self, group: Group, out: SchedulerOutput, protected: set[int]) -> int:
        """All running beams of a beam search decode in the same step, or none of them."""
        beams = [s for s in group.beam.running if s.status is Status.RUNNING]  # type: ignore[union-attr]
        if not beams or any(s.num_pending != 1 for s in beams):
            return 0
        needed = sum(self.blocks.blocks_needed(s, 1) for s in beams)
        while needed > self.blocks.num_free_blocks:
            victims = self._victims(protected | {s.seq_id for s in beams})
            if not victims:
                return 0
            self._preempt(victims[-1], out)
        for seq in beams:
            copy = self.blocks.make_writable(seq)
            if copy is not None:
                out.copies.append(copy)
            self.blocks.append_slots(seq, 1)
            protected.add(seq.seq_id)
            out.decodes.append(ScheduledSeq.of(seq, 1, decode=True))
        return len(beams)

    def _blocked_sibling(self, seq: Sequence) -> bool:
        """Siblings (best_of > 1) wait until the first sequence has filled the prefix cache."""
        if seq.index == 0 or not self.blocks.enable_prefix_caching:
            return False
        leader = seq.group.leader
        return not leader.finished and leader.num_computed < leader.num_prompt_tokens

    def decode_step_prefill_budget(self) -> int:
        """Most prompt tokens a step that also decodes may take now."""
        return self.prompt_budget.decode_step(len(self.running) + len(self.waiting))

    def _expire(self, out: SchedulerOutput) -> None:
        """Finish the waiting sequences, never scheduled yet, whose request's deadline has passed."""
        if not any(seq.group.deadline for seq in self.waiting):
            return
        now = self.clock()
        for seq in [s for s in self.waiting if 0 < s.group.deadline <= now and s.num_preemptions == 0]:
            self.finish(seq, "error")
            out.expired.append(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._expire(out)
        budget = self.max_num_batched_tokens
        protected: set[int] = set()

        # 1. running sequences that decode one token each; beam searches as a whole
        seen_groups: set[int] = set()
        for seq in [s for s in self.running if s.num_pending == 1]:
            if budget <= 0:
                break
            if seq.group.beam is not None and seq.num_computed >= seq.num_prompt_tokens:
                if id(seq.group) not in seen_groups:
                    seen_groups.add(id(seq.group))
                    budget -= self._schedule_beams(seq.group, out, protected)
                continue
            if seq.status is not Status.RUNNING:  # preempted to make room for an earlier one
                continue
            if not self._make_room(seq, 1, out, protected):
                continue
            protected.add(seq.seq_id)
            budget -= self._decode(seq, out, budget)

        decoding = bool(out.decodes or out.verifies)
        budget, hard, tail = self.prompt_budget.limits(budget, decoding, self.running, self.waiting)

        # 2. running sequences still prefilling (chunked prefill)
        for seq in [s for s in self.running if s.num_pending > 1]:
            if budget <= 0 or len(out.prefills) >= self.max_prefill_seqs:
                break
            if seq.status is not Status.RUNNING:
                continue
            n = seq.group.image_bound(seq.num_computed, chunk(seq.num_pending, budget, tail, hard))
            if not self._make_room(seq, n, out, protected):
                continue
            self.blocks.append_slots(seq, n)
            protected.add(seq.seq_id)
            out.prefills.append(ScheduledSeq.of(seq, n))
            budget, hard = budget - n, hard - n

        # 3. admit waiting sequences, oldest first; none while others had to be preempted
        skipped: list[Sequence] = []
        while (
            self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
            and len(out.prefills) < self.max_prefill_seqs
            and not out.preempted
        ):
            seq = self.waiting[0]
            if self._blocked_sibling(seq):
                skipped.append(self.waiting.popleft())
                continue
            cached = self.blocks.cached_prefix_blocks(seq)
            start = len(cached) * self.blocks.block_size
            n = seq.group.image_bound(start, chunk(seq.num_tokens - start, budget, tail, hard))
            if self.blocks.admission_cost(seq, cached, n) > self.blocks.num_free_blocks:
                break
            if not self._take_slot(seq.group):  # every slot is taken by adapters running now
                skipped.append(self.waiting.popleft())
                continue
            self.waiting.popleft()
            self.blocks.admit(seq, cached, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            protected.add(seq.seq_id)
            out.prefills.append(ScheduledSeq.of(seq, n))
            budget, hard = budget - n, hard - n
        for seq in reversed(skipped):
            self.waiting.appendleft(seq)
        if self.adapters is not None:  # one run of rows per adapter: fewer, larger LoRA products
            out.decodes.sort(key=self._slot_of)
            out.prefills.sort(key=self._slot_of)
        return out

    def _decode(self, seq: Sequence, out: SchedulerOutput, budget: int) -> int:
        """Schedule ``seq``'s decode, with its proposed tokens where the budget and the free blocks
        allow them all (a verify run); the tokens it takes."""
        draft = seq.draft
        n = 1 + len(draft)
        if draft and n <= budget and self.blocks.can_append(seq, n):
            self.blocks.append_slots(seq, n)
            out.verifies.append(ScheduledSeq(seq, n, seq.num_computed, True, False, tuple(draft)))
            return n
        self.blocks.append_slots(seq, 1)
        out.decodes.append(ScheduledSeq.of(seq, 1, decode=True))
        return 1

    def after_step(self, out: SchedulerOutput) -> None:
        """Record that the scheduled tokens are now in the cache (of a verify run, its first token
        only: which proposed tokens stay is known once they are checked, :meth:`accepted`)."""
        for item in out.scheduled:
            item.seq.num_computed += 1 if item.draft else item.num_tokens
            self.blocks.commit(item.seq)

    def accepted(self, seq: Sequence) -> None:
        """``seq``'s checked tokens are appended: every token but the newest is in the cache (the
        accepted proposals' keys and values were written by the verify run); the blocks past them
        go back (a rejected proposal's keys and values are never registered nor kept)."""
        seq.num_computed = seq.num_tokens - 1
        self.blocks.commit(seq)
        self.blocks.trim(seq)
