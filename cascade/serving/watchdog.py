"""Health that reflects a stuck model thread.

A pod's event loop keeps answering health checks and renewing its registry entry even when its
one model thread is stuck in a forward pass that never returns, so nothing would steer sessions
away from it. The watchdog sends a no-op through the model executor every ``interval_s``; one
that has not run after ``stall_s`` (queued behind the stuck work) marks the pod stalled until it
runs. ``GrpcService`` turns that into health NOT_SERVING and leaves the registry, and back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

log = logging.getLogger(__name__)

DEFAULT_STALL_S = 60.0
"""Longer than any legitimate step (a long prefill, a big batch) should take."""


def _noop() -> None:
    return None


class ExecutorWatchdog:
    def __init__(self, executor: Executor, stall_s: float = DEFAULT_STALL_S,
                 interval_s: float = 5.0) -> None:
        self.executor, self.stall_s, self.interval_s = executor, stall_s, interval_s
        self.is_stalled = False

    async def run(self, on_stall: Callable[[], Awaitable[None]],
                  on_recover: Callable[[], Awaitable[None]]) -> None:
        """Probe forever (until cancelled), calling on_stall / on_recover on each change."""
        loop = asyncio.get_running_loop()
        while True:
            probe = loop.run_in_executor(self.executor, _noop)
            try:
                await asyncio.wait_for(asyncio.shield(probe), self.stall_s)
            except TimeoutError:
                log.error("the model thread has not answered for %.0fs: reporting NOT_SERVING",
                          self.stall_s)
                self.is_stalled = True
                await on_stall()
                await probe
                log.warning("the model thread answers again: SERVING")
                self.is_stalled = False
                await on_recover()
            await asyncio.sleep(self.interval_s)
