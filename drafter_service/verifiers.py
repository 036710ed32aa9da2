"""Which verifiers a drafter may dial: the request names one, and a drafter must not become a
way into arbitrary hosts (or send a session's prompt to one).

An address passes when it is on the ``--allowed-verifiers`` list or, with a registry
(``--redis-url``), when a live verifier is registered under it. A drafter with neither dials
any address (tests, local development); it says so at start.
"""

from __future__ import annotations

import redis.asyncio as redis

from cascade.protocol.wire.validation import invalid
from cascade.serving.errors import Unavailable
from cascade.serving.registry import live_pods


class VerifierPolicy:
    def __init__(self, allowed: tuple[str, ...] = (), registry: redis.Redis | None = None) -> None:
        self.allowed, self.registry = frozenset(allowed), registry

    @classmethod
    def from_options(cls, allowed: str | None, registry: redis.Redis | None) -> VerifierPolicy:
        """``registry``: the pod's Redis client (the one its heartbeat uses), if any."""
        listed = tuple(a.strip() for a in (allowed or "").split(",") if a.strip())
        return cls(listed, registry)

    @property
    def is_open(self) -> bool:
        return not self.allowed and self.registry is None

    def describe(self) -> str:
        if self.is_open:
            return "any verifier address (no --allowed-verifiers, no registry)"
        sources = ["the registry"] if self.registry is not None else []
        sources += [f"{len(self.allowed)} allowed addresses"] if self.allowed else []
        return "verifiers from " + " and ".join(sources)

    async def check(self, address: str) -> None:
        """Raises for an address the drafter must not dial: RequestInvalid (INVALID_ARGUMENT)
        when it is not on the list, Unavailable (UNAVAILABLE: the caller may pick another)
        when the registry has no live verifier under it now (it may have just died or left:
        the caller saw its entry a moment earlier)."""
        if self.is_open or address in self.allowed:
            return
        if self.registry is not None:
            if any(p.address == address for p in await live_pods(self.registry, "verifier")):
                return
            raise Unavailable(f"verifier_address: {address!r} is not a registered verifier "
                              "now (nor on the drafter's --allowed-verifiers list)")
        raise invalid("verifier_address", f"{address!r} is not a registered verifier (nor on "
                                          "the drafter's --allowed-verifiers list)")
