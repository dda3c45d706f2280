"""Paged KV-cache blocks: allocation with reference counts, and prefix caching.

A block holds the keys and values of ``block_size`` consecutive tokens of a sequence.
When a block is full its content is identified by a hash chained over every token before
it, so two sequences that share a prompt prefix (a system prompt, a chat history) can share
the blocks of that prefix instead of computing them again. Freed blocks keep their content
and stay findable until the space is needed (least recently freed first).

Free blocks without reusable content are handed out last-freed-first, in address order, so
a sequence's blocks tend to be neighbours in memory and recently used memory is reused while
it is still in the CPU caches.

Plain Python, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    tokens: tuple[int, ...] | None = None


def chain_hash(parent: int | None, tokens: tuple) -> int:
    return hash((parent, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._clean: list[int] = list(reversed(range(num_blocks)))  # a stack: block 0 is taken first
        self._cached: OrderedDict[int, None] = OrderedDict()  # free blocks with content, oldest first
        self._by_hash: dict[int, int] = {}
        self.prefix_hit_tokens = 0

    # --- accounting ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._clean) + len(self._cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks ``seq`` needs to hold ``num_new_tokens`` more computed tokens (a shared
        block about to be written counts: it is copied first)."""
        grow = max(0, self.blocks_for(seq.num_computed + num_new_tokens) - len(seq.block_table))
        return grow + (1 if self.needs_copy(seq) else 0)

    # --- forks (beam search) -------------------------------------------------------------
    def fork(self, parent: Sequence) -> list[int]:
        """A block table sharing every block of ``parent`` (reference counted)."""
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        return list(parent.block_table)

    def needs_copy(self, seq: Sequence) -> bool:
        index = seq.num_computed // self.block_size
        return index < len(seq.block_table) and self.blocks[seq.block_table[index]].ref_count > 1

    def make_writable(self, seq: Sequence) -> tuple[int, int] | None:
        """Copy-on-write: give ``seq`` its own copy of the shared block its next token goes
        into. Returns ``(source, copy)`` for the cache to copy, or None."""
        if not self.needs_copy(seq):
            return None
        index = seq.num_computed // self.block_size
        source = seq.block_table[index]
        copy = self._take_free()
        self.blocks[source].ref_count -= 1
        seq.block_table[index] = copy
        return source, copy

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    # --- allocation ---------------------------------------------------------------------
    def _take_free(self) -> int:
        if self._clean:
            block_id = self._clean.pop()
        else:
            block_id, _ = self._cached.popitem(last=False)  # evict the least recently freed content
        block = self.blocks[block_id]
        if block.hash is not None and self._by_hash.get(block.hash) == block_id:
            del self._by_hash[block.hash]
        block.hash = None
        block.tokens = None
        block.ref_count = 1
        return block_id

    def _reuse(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._cached[block_id]
        block.ref_count += 1

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give ``seq`` the blocks it needs for ``num_new_tokens`` more tokens (caller checked)."""
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            seq.block_table.append(self._take_free())

    # --- prefix caching ---------------------------------------------------------------
    def _content(self, seq: Sequence, i: int) -> tuple:
        """What block ``i`` of ``seq`` holds: its tokens, and the digests of the pictures whose
        placeholder tokens it holds (two prompts with different pictures never share KV)."""
        bs = self.block_size
        tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
        images = seq.group.images
        if images:
            digests = tuple(m.digest for m in images if m.offset < (i + 1) * bs and m.offset + m.length > i * bs)
            if digests:
                return (*tokens, digests)
        return tokens

    def _hashes(self, seq: Sequence, count: int) -> list[tuple[int, tuple]]:
        out = []
        parent = seq.group.cache_key
        for i in range(count):
            tokens = self._content(seq, i)
            parent = chain_hash(parent, tokens)
            out.append((parent, tokens))
        return out

    def cached_prefix_blocks(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of ``seq``'s tokens.

        At least one token is always left to compute, so the model produces logits for it.
        """
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        usable = (seq.num_tokens - 1) // self.block_size
        found = []
        for block_hash, tokens in self._hashes(seq, usable):
            block_id = self._by_hash.get(block_hash)
            if block_id is None or self.blocks[block_id].tokens != tokens:
                break
            found.append(block_id)
        return found

    def admit(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> None:
        """Attach the cached prefix blocks and the blocks for the first chunk of a waiting sequence."""
        for block_id in cached:
            self._reuse(block_id)
        seq.block_table = list(cached)
        seq.num_computed = len(cached) * self.block_size
        seq.num_hashed_blocks = len(cached)
        seq.num_cached_prompt_tokens = min(seq.num_computed, seq.num_prompt_tokens)
        self.prefix_hit_tokens += seq.num_computed
        self.append_slots(seq, num_new_tokens)

    def admission_cost(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> int:
        """Free blocks admitting ``seq`` would consume (reusing a free cached block counts)."""
        reused_free = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        total = self.blocks_for(len(cached) * self.block_size + num_new_tokens)
        return reused_free + (total - len(cached))

    def commit(self, seq: Sequence) -> None:
        """Register the blocks ``seq`` has just filled, so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed, seq.num_tokens) // self.block_size
        if full <= seq.num_hashed_blocks:
            return
        parent = (
            self.blocks[seq.block_table[seq.num_hashed_blocks - 1]].hash
            if seq.num_hashed_blocks
            else seq.group.cache_key
        )
        for i in range(seq.num_hashed_blocks, full):
            tokens = self._content(seq, i)
            parent = chain_hash(parent, tokens)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.tokens = parent, tokens
                self._by_hash.setdefault(parent, block.block_id)
        seq.num_hashed_blocks = full

    # --- release ------------------------------------------------------------------------
    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past ``seq``'s computed tokens (those of a step that did not run)."""
        keep = max(self.blocks_for(seq.num_computed), seq.num_hashed_blocks)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is None:
                self._clean.append(block_id)
            else:
                self._cached[block_id] = None

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks; cached content stays reusable until the block is taken."""
        # release the tail first: cached content of the prefix stays the longest, and blocks
        # without content go back on the stack so the head is taken first next time
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed = 0
        seq.num_hashed_blocks = 0
