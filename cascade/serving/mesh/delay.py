"""Injected network delay between a drafter and its verifiers, so a loopback cluster behaves
like a drafter ``one_way_ms`` away (tests and benchmarks of drafting across a network).

Each message waits ``one_way_ms`` plus a jitter drawn uniformly from ±``jitter_ms`` (never
below zero): blocks before they are sent, verdicts after they arrive. Draws come from a
generator seeded per session, so a run is repeatable. ``DelayedWriter`` delays outgoing messages
as a network does: each one is late by its delay, but sending it holds up neither the sender nor
the messages after it (which still arrive in order).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkDelay:
    one_way_ms: float = 0.0
    jitter_ms: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.one_way_ms < 0 or self.jitter_ms < 0:
            raise ValueError(f"delays must be >= 0 ms, got {self.one_way_ms} and "
                             f"{self.jitter_ms}")

    @property
    def is_off(self) -> bool:
        return self.one_way_ms == 0 and self.jitter_ms == 0

    def for_session(self, session_id: str) -> SessionDelay:
        digest = hashlib.sha256(f"{self.seed}:{session_id}".encode()).digest()
        return SessionDelay(self, random.Random(int.from_bytes(digest[:8], "big")))


@dataclass
class SessionDelay:
    link: LinkDelay
    rng: random.Random

    def next_s(self) -> float:
        jitter = self.rng.uniform(-self.link.jitter_ms, self.link.jitter_ms)
        return max(0.0, self.link.one_way_ms + jitter) / 1000

    async def wait(self) -> None:
        """One message's trip (returns at once when the link has no delay)."""
        if not self.link.is_off:
            await asyncio.sleep(self.next_s())


class DelayedWriter:
    """Writes messages through ``write`` after each one's delay, in order, from its own task;
    a failed write is raised by the next ``send`` or ``flush``. Without a delay each ``send``
    writes at once, one write at a time: several tasks send on one stream (a session's blocks,
    its shadow blocks, its draft-ready notes), and a gRPC stream takes one write at a time (a
    second one while the first is pending fails the call with TOO_MANY_OPERATIONS)."""

    def __init__(self, write: Callable[[Any], Awaitable[None]], delay: SessionDelay) -> None:
        self.write, self.delay = write, delay
        self._queue: asyncio.Queue = asyncio.Queue()
        self._last_due = 0.0
        self._error: BaseException | None = None
        self._task: asyncio.Task | None = None
        self._writing = asyncio.Lock()

    async def send(self, message) -> None:
        if self.delay.link.is_off:
            async with self._writing:
                await self.write(message)
            return
        self._raise_error()
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        self._last_due = max(self._last_due, time.monotonic() + self.delay.next_s())
        self._queue.put_nowait((self._last_due, message))

    async def flush(self) -> None:
        """Wait until every message sent so far is written."""
        if self._task is not None:
            await self._queue.join()
        async with self._writing:  # a write without delay still pending
            pass
        self._raise_error()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    async def _run(self) -> None:
        while True:
            due, message = await self._queue.get()
            try:
                if self._error is None:
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    await self.write(message)
            except Exception as exc:  # noqa: BLE001 - handed to the sender
                self._error = exc
            finally:
                self._queue.task_done()
