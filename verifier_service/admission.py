"""Admission: a session opens when the engine's KV store has the blocks its context needs now
(not its whole max_tokens: blocks grow with the sequence, and running sequences are preempted
when they run out, ``cascade.core.verify.paged_cache``); when it has not, the open waits up to
``admission_wait_s`` for closing sessions to make some, then fails with RESOURCE_EXHAUSTED
(``Overloaded``), which the gateway turns into HTTP 429. One whose prompt plus max_tokens could
never fit the whole store fails at once.

Fair share: while sessions of another prefix scope (another API key: ``SessionOpen.prefix_scope``)
that holds less than ``max_kv_share`` of the budget wait for memory, a scope that would pass that
share admits nothing more, so memory that frees goes to the others first (one key's many long sessions held the whole
budget, and every other key's opens timed out). With no one else waiting a scope may take it
all: the rule never leaves memory idle.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from cascade.core.verify.engine import KVBudgetExhausted, VerifyEngine
from cascade.core.kv.kv_store import BLOCK_SIZE, blocks_for
from cascade.serving import metrics
from cascade.serving.errors import Overloaded


class Admission:
    def __init__(self, engine: VerifyEngine, wait_s: float, max_share: float,
                 has_sessions: Callable[[], bool]) -> None:
        """``has_sessions()``: whether any session is open (none: waiting frees nothing)."""
        self.engine, self.wait_s, self.max_share = engine, wait_s, max_share
        self.has_sessions = has_sessions
        self.waiting: Counter[str] = Counter()
        """Scope -> its opens waiting for memory."""
        self._freed = asyncio.Condition()

    async def admit(self, build, scope: str, positions: int):
        """``build()`` once KV memory and ``scope``'s share allow (``positions``: what it
        takes now), waiting up to ``wait_s`` for them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        self.waiting[scope] += 1
        metrics.REQUESTS_WAITING.inc()
        try:
            while True:
                try:
                    self._check_share(scope, positions)
                    return build()
                except KVBudgetExhausted as exc:
                    remaining = deadline - loop.time()
                    if remaining <= 0 or exc.never_fits or not self.has_sessions():
                        raise Overloaded(f"{exc}; retry later or on another verifier") from exc
                    await self._wait(remaining)
        finally:
            self.waiting[scope] -= 1
            if self.waiting[scope] <= 0:
                del self.waiting[scope]
            metrics.REQUESTS_WAITING.dec()
            await self.freed()  # others may have waited for this scope to stop waiting

    def _check_share(self, scope: str, positions: int) -> None:
        """KVBudgetExhausted if ``scope`` would pass its share while another scope, under its
        own share, waits."""
        share = int(self.max_share * self.engine.store.capacity)
        if not any(other != scope and self.held(other) < share for other in self.waiting):
            return
        held = self.held(scope)
        if held + (blocks_for(positions) + 1) * BLOCK_SIZE > share:  # and a block of growth
            raise KVBudgetExhausted(
                f"this key's sessions hold {held} of the verifier's {self.engine.store.capacity} "
                f"KV positions while other keys' sessions wait (a key's share while others "
                f"wait: {share})")

    def held(self, scope: str) -> int:
        """KV positions the live sessions of ``scope`` hold or were promised (``promised``:
        not yet fed, and a block of growth each)."""
        return BLOCK_SIZE * sum(len(c.table) + c.pending + 1
                                for c in self.engine.prefixes.of_scope(scope))

    async def _wait(self, timeout_s: float) -> None:
        async with self._freed:
            try:
                await asyncio.wait_for(self._freed.wait(), timeout_s)
            except TimeoutError:
                pass

    async def freed(self) -> None:
        """Memory was given back, or the waiters changed: waiting opens try again."""
        async with self._freed:
            self._freed.notify_all()
