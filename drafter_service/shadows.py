"""Shadow blocks (verifier.proto ``ShadowBlock``): while the verifier decodes a greedy session
alone, the session's drafter, idle otherwise, drafts k tokens (a tree session: a tree k deep)
from a past context now and then
(``MAX_SHADOW_BLOCKS``) and sends them. The verifier scores them against the tokens it
committed there and so learns when drafting would pay again, with no probe round on the
session's critical path. Shadow drafting runs on the pod's model thread like any draft; the
verdicts keep being relayed meanwhile.

A chain session alone on its pod also drafts one token at the tail after each round decoded
alone that drafts no shadow (``tail``: one pass, feeding the round's tokens, which the next
block needs fed anyway) and sends it once the verifier has committed its position. So
position 1, the one that decides whether drafting pays at all, is observed every round as if
the session drafted k = 1, and a stretch of low acceptance is followed as fast out of decoding
alone as into it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from cascade.core.blocks import Draft
from cascade.session.events import shadow_request
from cascade.v1 import verifier_pb2


MAX_SHADOW_BLOCKS = 16
"""Blocks' worth of committed tokens between a session's shadows: one per session on the pod
(a lone session shadows every block), at most this many (64 tokens at k = 4). A pod's shadow
work then stays about one block per k tokens the verifier commits for one session, whatever the
load: a lightly loaded pod learns a session's acceptance within a few blocks, a busy one (whose
sessions' estimates pool per method) spends little of its core on shadows."""


@dataclass
class Shadows:
    propose: Callable[[list[int], int], Draft]
    """The session's proposer (runs on the model thread)."""
    executor: Executor
    send: Callable[[verifier_pb2.VerifyRequest], Awaitable[None]]
    epoch: int
    k: int
    load: Callable[[], int]
    """Sessions on the drafter pod now."""
    due: int
    """The committed length at which the next shadow is due (the prompt's end plus k at first,
    then one block per session on the pod past the last shadow, at most MAX_SHADOW_BLOCKS)."""
    budget: int = 0
    """What a shadow drafts (``propose``'s budget): k, or a tree session's nodes (0: k)."""
    task: asyncio.Future | None = None
    stopped: bool = False
    tail: tuple[int, int] | None = None
    """(position, token): the token drafted at the committed tokens' end, sent once the
    verifier has committed that position."""

    def after(self, committed: list[int]) -> None:
        """After a round decoded alone, unless a shadow is being drafted: a shadow of the last
        k committed tokens when one is due, else a new tail token (a chain alone on its pod);
        either sends the tail token drafted before first, if its position is committed now."""
        if self.stopped or (self.task and not self.task.done()):
            return
        if len(committed) >= self.due:
            blocks = min(MAX_SHADOW_BLOCKS, max(1, self.load()))
            self.due = len(committed) + blocks * self.k
            self.task = asyncio.ensure_future(self._shadow(committed[:len(committed) - self.k],
                                                           len(committed)))
        elif not self.budget and self.load() == 1:
            self.task = asyncio.ensure_future(self._draft_tail(list(committed)))

    async def _send_tail(self, num_committed: int) -> None:
        if self.tail is not None and self.tail[0] < num_committed:
            (position, token), self.tail = self.tail, None
            await self._send_shadow(position, [token])

    async def _draft_tail(self, context: list[int]) -> None:
        await self._send_tail(len(context))
        loop = asyncio.get_running_loop()
        draft = await loop.run_in_executor(self.executor, self.propose, context, 1)
        if draft.num_tokens and not self.stopped:
            self.tail = (len(context), draft.tokens[0])

    async def _shadow(self, context: list[int], num_committed: int) -> None:
        await self._send_tail(num_committed)
        loop = asyncio.get_running_loop()
        draft = await loop.run_in_executor(self.executor, self.propose, context,
                                           self.budget or self.k)
        if draft.parents is None:  # a chain may run past k on forced tokens: only k are committed
            draft = draft.prefix(self.k)
        if draft.num_tokens and not self.stopped:
            await self._send_shadow(len(context), draft.tokens, draft.parents or ())

    async def _send_shadow(self, base_len: int, tokens: list[int], parents=()) -> None:
        await self.send(shadow_request(self.epoch, base_len, tokens, parents))

    async def stop(self) -> None:
        """No shadow after this; the one being drafted finishes unsent (so no shadow is written
        while the session's next block is)."""
        self.stopped = True
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task
