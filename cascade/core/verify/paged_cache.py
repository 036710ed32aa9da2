"""One sequence's KV entries on the verifier: a block table in the engine's store
(``cascade.core.kv.kv_store``), grown as the sequence grows, and what happens when blocks run out.

A sequence is admitted for the blocks it needs now, not for its whole ``max_tokens``
(``VerifyEngine.admit``). Each pass first makes sure every row's table covers the positions it
feeds (``make_room``); when the store has too few blocks, sequences are *preempted*: their
blocks are let go (full blocks of committed positions stay registered in the prefix cache), and
the sequence feeds its committed tokens again at its next pass, which is exact (the invariant
pass gives a position the same entries whatever pass feeds it). Who goes first: sequences with
no row in this pass, the most recently admitted first (they lose the least work, and the oldest
sequences keep going, as vLLM orders it); then rows of the pass itself, the most recently
admitted first, whose items fail with ``Preempted`` and are queued again by the scheduler.
"""

from __future__ import annotations

from cascade.core.kv.kv_store import BLOCK_SIZE, BlockTable, blocks_for
from cascade.core.forward.packed import Feed
from cascade.core.model.runner import common_prefix_len
from cascade.core.trees import leaf_chain_len


class KVBudgetExhausted(Exception):
    """The KV store cannot hold a new sequence now (``never_fits``: not even when empty)."""

    def __init__(self, message: str, never_fits: bool = False) -> None:
        super().__init__(message)
        self.never_fits = never_fits


class Preempted(KVBudgetExhausted):
    """This row's sequence was preempted to make room for the pass: its item runs again in a
    later step (its cache feeds its committed tokens again)."""


class PagedCache:
    """The KV entries of one sequence: ``tokens`` are exactly the positions its blocks hold."""

    def __init__(self, engine, scope: str = "", order: int = 0, pending: int = 0) -> None:
        """``order``: admission order (later = preempted first); ``pending``: blocks its first
        pass needs, counted against new admissions until then."""
        self.engine, self.scope, self.order, self.pending = engine, scope, order, pending
        self.table = BlockTable()
        self.tokens: list[int] = []
        self.keys: list[bytes] = []
        """The chained prefix-cache keys of its first full blocks (``prefix_cache``)."""
        self.closed = False

    @property
    def store(self):
        return self.engine.store

    def reuse(self, tokens: list[int], num_logits: int) -> int:
        """Positions of ``tokens`` a pass keeps: those held, but at least the last
        ``num_logits`` are fed again."""
        return min(common_prefix_len(self.tokens, tokens), len(tokens) - num_logits)

    def blocks_needed(self, tokens: list[int], num_logits: int) -> int:
        """Blocks a pass feeding ``tokens`` takes from the store (new ones and copies)."""
        first = self.reuse(tokens, num_logits) // BLOCK_SIZE
        kept = min(len(self.table), blocks_for(len(tokens)))
        copies = sum(self.store.is_shared(b) for b in self.table.blocks[first:kept])
        return max(0, blocks_for(len(tokens)) - len(self.table)) + copies

    def feed(self, tokens: list[int], num_logits: int,
             parents: tuple[int, ...] | None = None) -> Feed:
        """The row that makes the table hold ``tokens`` (rejected positions are forgotten by
        shortening, nothing is copied); at least the last ``num_logits`` are fed again. With
        ``parents`` the last tokens are a tree: afterwards the table holds, as a sequence, the
        part before the tree and its leading chain, until ``compact`` keeps a path. Raises
        KVBudgetExhausted when the store has no block for it (``make_room`` comes first)."""
        if self.closed:
            raise ValueError("the sequence's KV memory was given back; it cannot be fed")
        reuse = self.reuse(tokens, num_logits)
        self._fit(reuse, len(tokens))
        held = len(tokens) - len(parents or ()) + leaf_chain_len(parents or ())
        self.tokens = list(tokens[:held])
        self.pending = 0
        return Feed(self.table, reuse, tokens[reuse:], parents)

    def _fit(self, first: int, length: int) -> None:
        """Blocks for positions 0 .. length - 1, those from ``first`` on writable: extra
        blocks let go, shared ones copied, missing ones taken."""
        blocks, need = self.table.blocks, blocks_for(length)
        while len(blocks) > need:
            self.store.release(blocks.pop())
        self.tokens = self.tokens[:first]
        self.keys = self.keys[: first // BLOCK_SIZE]
        for i in range(first // BLOCK_SIZE, len(blocks)):
            if self.store.is_shared(blocks[i]):
                copy = self.store.allocate(blocks[i - 1] if i else None)
                if copy is None:
                    raise self._exhausted()
                self.store.copy_block(blocks[i], copy)
                self.store.release(blocks[i])
                blocks[i] = copy
        if not self.store.grow(self.table, need):
            raise self._exhausted()

    def _exhausted(self) -> KVBudgetExhausted:
        return KVBudgetExhausted(f"the verifier's KV store has no free block "
                                 f"({self.store.num_blocks} blocks, all held)")

    def compact(self, base: int, path: list[int], tokens: list[int]) -> None:
        """Keep a tree's accepted path: move the KV entries of nodes ``path`` (fed from slot
        ``base``) into slots base, base + 1, ... (only those entries move)."""
        sources = [base + node for node in path]
        targets = list(range(base, base + len(path)))
        if sources != targets:
            self.store.move(self.table, sources, targets)
        self.tokens = self.tokens[:base] + tokens

    def drop_blocks(self) -> None:
        """Let every block go (its full ones stay in the prefix cache) and hold nothing."""
        self.engine.prefixes.register(self, len(self.tokens))
        for block in self.table.blocks:
            self.store.release(block)
        self.table.blocks, self.tokens, self.keys = [], [], []

    def release(self) -> None:
        """Give the blocks back for good (idempotent)."""
        if not self.closed:
            self.engine.prefixes.discard(self)
            self.drop_blocks()
            self.closed, self.pending = True, 0


def make_room(engine, passes: list) -> set[int]:
    """Preempt sequences until the store holds the blocks ``passes`` need; the indices of the
    passes left out of this step (their sequences were preempted, or held nothing yet).

    Order: the most recently admitted first, whether it has a row in this step or not (a row
    of the step that holds no blocks yet just waits): the oldest sequences always go on, so
    every sequence finishes, and the latest have the least work to redo (vLLM's order). A
    preempted sequence's blocks count as promised to it (``pending``), so new admissions wait
    behind it."""
    store, dropped = engine.store, set()
    needs = [p.cache.blocks_needed(p.tokens, p.num_leading + p.num_logits) for p in passes]
    row_of = {id(p.cache): i for i, p in enumerate(passes)}
    holding = [c for c in engine.prefixes.live() if c.table.blocks and id(c) not in row_of]
    victims = sorted(holding + [p.cache for p in passes], key=lambda c: -c.order)
    for victim in victims:
        if sum(n for i, n in enumerate(needs) if i not in dropped) <= store.available:
            break
        if id(victim) in row_of:
            dropped.add(row_of[id(victim)])
        if victim.table.blocks:
            held = len(victim.table)
            victim.drop_blocks()
            victim.pending = held
            engine.preemptions += 1
    return dropped
