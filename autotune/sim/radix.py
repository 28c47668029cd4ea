"""SGLang's radix (prefix) cache as the simulated scheduler keeps it: prompts' leading tokens kept in the KV
pool after their request, matched by later prompts, evicted least recently used first.

Blocks of BLOCK tokens are named by the hash of their tokens and of every block before them, so a block
matches only behind the same prefix. What it takes from SGLang's RadixAttention, and what not:
docs/design.md, "The radix cache".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BLOCK", "PrefixCache", "block_hashes"]

BLOCK = 16


def block_hashes(tokens: Sequence[int], block: int = BLOCK) -> tuple[int, ...]:
    """The chained hashes of `tokens`' whole blocks: block i's names it and the blocks before it."""
    hashes, previous = [], 0
    for start in range(0, len(tokens) - block + 1, block):
        previous = hash((previous, tuple(tokens[start : start + block])))
        hashes.append(previous)
    return tuple(hashes)


class PrefixCache:
    """Cached blocks in least-recently-used order; a request's blocks stay while it runs (it touched them
    last, and `evict_to` is only asked to make room the running requests leave)."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self._blocks: OrderedDict[int, None] = OrderedDict()

    @property
    def tokens(self) -> int:
        return len(self._blocks) * self.block

    def match(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """How many leading tokens of a prompt the cache holds (at most all but its last token, which SGLang
        always computes to sample the first output token); the matched blocks become the most recent."""
        matched = self.peek(hashes)
        # A tree evicts leaves first: the deepest block is touched first, so the root is the most recent.
        for value in reversed(hashes[:matched]):
            self._blocks.move_to_end(value)
        cached = min(matched * self.block, prompt_tokens - 1)
        return max(cached, 0)

    def peek(self, hashes: Sequence[int]) -> int:
        """How many leading blocks the cache holds, touching nothing (the lpm policy's sort key)."""
        matched = 0
        for value in hashes:
            if value not in self._blocks:
                break
            matched += 1
        return matched

    def insert(self, hashes: Sequence[int]) -> None:
        """Keep a prefilled prompt's blocks, as SGLang inserts a request's KV into its tree."""
        for value in reversed(hashes):
            self._blocks[value] = None
            self._blocks.move_to_end(value)

    def evict_to(self, room_tokens: int) -> None:
        """Evict least recently used blocks until the cache holds at most `room_tokens` tokens."""
        while self._blocks and self.tokens > max(room_tokens, 0):
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        """`/flush_cache`: forget every block."""
        self._blocks.clear()
