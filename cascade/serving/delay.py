"""Injected network delay between a drafter and its verifiers, so a loopback cluster behaves
like a drafter ``one_way_ms`` away (tests and benchmarks of drafting across a network).

Each message waits ``one_way_ms`` plus a jitter drawn uniformly from ±``jitter_ms`` (never
below zero): blocks before they are sent, verdicts after they arrive. Draws come from a
generator seeded per session, so a run is repeatable.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
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
