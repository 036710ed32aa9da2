"""Pre-drafting while a block is verified (``drafter_service.speculation``): guess the block's
likeliest outcomes, draft the next block after each, and send the likeliest ahead.

A chain's guesses are drafted as rows of one batch (the ``FIRST_BATCH`` likeliest, then the
rest); a token tree's one after another, each sent ahead as soon as it is made, and a tree the
verdict interrupts is dropped (it stops between depths). Guesses and pre-drafts run on the model
thread (``executor``); everything here stops at the next step once ``stop`` is set.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from cascade.core.blocks import Draft
from cascade.core.proposers import Guesses, Proposer, guesser
from cascade.core.plan.speculation import Outcome, ends_generation, rank_outcomes
from cascade.protocol.settings import SamplingParams
from cascade.serving import metrics
from cascade.v1 import verifier_pb2
from drafter_service.speculation import SpeculationCache, SpeculationConfig

FIRST_BATCH = 4
"""Pre-drafts in the first batch of a round (the likeliest guesses, ready and sent ahead soon);
the rest follow in a second batch."""
MIN_PARTIAL = 2
"""A pre-draft the verdict stopped is kept when it has at least this many tokens (or its
whole budget): sent at once it still beats drafting a full block while the verifier waits."""

MakeBlock = Callable[[Draft, int, list[int], int], verifier_pb2.DraftBlock]
"""(draft, round, the context it follows, draft microseconds) -> the block to send."""
Send = Callable[[verifier_pb2.VerifyRequest], Awaitable[None]]


class PreDrafter:
    """One session's pre-drafts for the block being verified."""

    def __init__(self, proposer: Proposer, executor: Executor, config: SpeculationConfig,
                 params: SamplingParams, prompt_len: int, budget: Callable[[list[int]], int],
                 make_block: MakeBlock) -> None:
        """``proposer``: one that ``Guesses`` (pre-drafting is on only for such proposers,
        ``cascade.core.proposers.guesser``); ``budget``: tokens worth drafting after a (guessed)
        context; ``make_block``: a draft as the block the session sends."""
        self.proposer, self.executor, self.config = proposer, executor, config
        self.guesses = guesser(proposer)
        self.params, self.prompt_len = params, prompt_len
        self.budget, self.make_block = budget, make_block
        self.is_tree = bool(proposer.config.tree_nodes)

    async def speculate(self, block: verifier_pb2.DraftBlock, base: list[int],
                        cache: SpeculationCache, send: Send, stop: threading.Event) -> None:
        """Pre-draft the next block for the likeliest outcomes of ``block`` (drafted after
        ``base``) until the verdict arrives (``stop``) or ``max_blocks`` are made, the
        likeliest first; send the first ``send_ahead`` of them ahead."""
        method = self.guesses
        if method is None or not method.guesses_after(block.source, len(block.tokens)):
            return
        drafted = list(block.tokens)
        guesses = await self._guesses(method, base, drafted, list(block.parents) or None)
        contexts = await self._run(self._guessed_contexts, method, guesses, base, drafted)
        outcomes = [o for o in guesses if not ends_generation(
            o, drafted, len(contexts[o]), self.prompt_len, self.params)]
        for chunk in self._batches(outcomes):
            if not chunk or stop.is_set():
                return
            blocks = await self._draft_many(block.round + 1, [contexts[o] for o in chunk], stop)
            ready = {o: b for o, b in zip(chunk, blocks) if b is not None}
            for outcome, pre_drafted in ready.items():
                cache.add(outcome, pre_drafted)
            metrics.SSD_PREDRAFTS.inc(len(ready))
            await self._send_ahead(list(ready), cache, send, stop)

    async def _run(self, function, *args):
        """``function(*args)`` on the model thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _guesses(self, method: Guesses, base: list[int], drafted: list[int],
                       parents: list[int] | None) -> list[Outcome]:
        """The likeliest outcomes of the block ``drafted`` (a tree's: ``parents``) after
        ``base``, best first."""
        probs = await self._run(method.block_distributions, base, drafted, parents)
        return [g.outcome for g in rank_outcomes(probs, drafted, self.config.fanout,
                                                 self.config.max_blocks, parents)]

    @staticmethod
    def _guessed_contexts(method: Guesses, guesses: list[Outcome], base: list[int],
                          drafted: list[int]) -> dict[Outcome, list[int]]:
        """The committed tokens after each guessed outcome, with the tokens the verifier would
        fill in after it (on the model thread: the proposer's grammar state is not shared)."""
        contexts = {o: o.context(base, drafted) for o in guesses}
        return {o: c + method.filled_after(c) for o, c in contexts.items()}

    def _batches(self, outcomes: list[Outcome]) -> list[list[Outcome]]:
        """Pre-drafts in the order they are drafted: the ``FIRST_BATCH`` likeliest, then the
        rest; trees one by one (each is sent as soon as it is made)."""
        if self.is_tree:
            return [[outcome] for outcome in outcomes]
        return [outcomes[:FIRST_BATCH], outcomes[FIRST_BATCH:]]

    async def _draft_many(self, round_number: int, contexts: list[list[int]],
                          stop: threading.Event) -> list[verifier_pb2.DraftBlock | None]:
        """Blocks after several guessed contexts, drafted as one batch; None where the verdict
        stopped a block before it was worth sending (``_least_kept``)."""
        started = time.perf_counter()
        budgets = [self.budget(c) for c in contexts]
        drafts = await self._run(self.proposer.propose_many, contexts, budgets, stop.is_set)
        draft_us = int((time.perf_counter() - started) * 1e6)
        return [self.make_block(d, round_number, c, draft_us)
                if d.num_tokens >= self._least_kept(n) else None
                for d, c, n in zip(drafts, contexts, budgets)]

    def _least_kept(self, budget: int) -> int:
        """Tokens a pre-draft needs to be kept: ``MIN_PARTIAL`` (or its budget), or only
        complete blocks without keep_partial (lengths independent of timing). A tree comes
        whole or not at all (a stopped one is dropped between depths)."""
        if self.is_tree:
            return 0
        return min(budget, MIN_PARTIAL) if self.config.keep_partial else budget

    async def _send_ahead(self, outcomes: list[Outcome], cache: SpeculationCache, send: Send,
                          stop: threading.Event) -> None:
        """Send pre-drafted blocks ahead, the likeliest first, while the verdict is out."""
        for outcome in outcomes:
            if len(cache.sent) >= self.config.sends_ahead or stop.is_set():
                return
            await send(verifier_pb2.VerifyRequest(block=cache.tagged(outcome)))
            metrics.SSD_SENT_AHEAD.inc()
