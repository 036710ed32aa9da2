"""Shadow blocks (verifier.proto ``ShadowBlock``): while the verifier decodes a greedy session
alone, the session's drafter, idle otherwise, drafts k tokens from a past context once every k
committed tokens and sends them. The verifier scores them against the tokens it committed there
and so learns when drafting would pay again, with no probe round on the session's critical
path. Shadow drafting runs on the pod's model thread like any draft; the verdicts keep being
relayed meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from cascade.core.blocks import Draft
from cascade.v1 import verifier_pb2


@dataclass
class Shadows:
    propose: Callable[[list[int], int], Draft]
    """The session's proposer (runs on the model thread)."""
    executor: Executor
    send: Callable[[verifier_pb2.VerifyRequest], Awaitable[None]]
    epoch: int
    k: int
    start: int
    """The first position a shadow may draft: the prompt's end, then past the last shadow."""
    task: asyncio.Future | None = None
    stopped: bool = False

    def after(self, committed: list[int]) -> None:
        """After a round decoded alone: a shadow of the last k committed tokens, when they all
        lie past the previous shadow's and none is being drafted."""
        base = len(committed) - self.k
        if self.stopped or base < self.start or (self.task and not self.task.done()):
            return
        self.start = len(committed)
        self.task = asyncio.ensure_future(self._shadow(committed[:base]))

    async def _shadow(self, context: list[int]) -> None:
        loop = asyncio.get_running_loop()
        draft = await loop.run_in_executor(self.executor, self.propose, context, self.k)
        if draft.num_tokens and not self.stopped:
            await self.send(verifier_pb2.VerifyRequest(shadow=verifier_pb2.ShadowBlock(
                epoch=self.epoch, base_len=len(context), tokens=draft.tokens)))

    async def stop(self) -> None:
        """No shadow after this; the one being drafted finishes unsent (so no shadow is written
        while the session's next block is)."""
        self.stopped = True
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task
