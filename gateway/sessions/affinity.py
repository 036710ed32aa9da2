"""The choices of one request's prompt go to the same pods.

A verifier computes a prompt's keys and values once and copies them into every other session
that begins the same way (``cascade.core.kv.prefix_cache``), so the ``n`` choices and ``best_of``
candidates of a request, which are sessions of their own, gain only when they meet on one
verifier. ``PromptAffinity`` remembers the pods picked for a (request group, prompt) while a
session of it runs on this gateway; the group's other sessions of that prompt take those pods,
unless the failure handling cools them. Sessions moved after a failure pick afresh. Only a
request's own choices are pinned: pinning every session of a popular prompt to one verifier
would undo the load balancing.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

Pods = tuple[str | None, str]
"""(drafter or None, verifier)."""


@dataclass
class _Entry:
    pods: asyncio.Future
    users: int = 1


@dataclass
class PromptAffinity:
    _entries: dict[bytes, _Entry] = field(default_factory=dict)

    @staticmethod
    def key(group: str, prompt: list[int], drafted: bool) -> bytes | None:
        """None: not one of several choices (picked on its own)."""
        if not group:
            return None
        digest = hashlib.blake2b(np.asarray(prompt, dtype=np.int64).tobytes(), digest_size=16)
        digest.update(f"{group}/{int(drafted)}".encode())
        return digest.digest()

    async def pick(self, key: bytes | None, pick: Callable[[], Awaitable[Pods]],
                   usable: Callable[[Pods], bool]) -> Pods:
        """The pods of the prompt's running sessions when ``usable``, else ``pick()``'s (which
        later sessions of the prompt then take). Every call is paired with ``release(key)``."""
        if key is None:
            return await pick()
        entry = self._entries.get(key)
        if entry is not None:
            entry.users += 1
            pods = await asyncio.shield(entry.pods)  # None: the first pick failed
            if pods is not None and usable(pods):
                return pods
            return await pick()
        entry = self._entries[key] = _Entry(asyncio.get_running_loop().create_future())
        pods = None
        try:
            pods = await pick()
            return pods
        finally:
            entry.pods.set_result(pods)

    def release(self, key: bytes | None) -> None:
        entry = self._entries.get(key) if key is not None else None
        if entry is not None:
            entry.users -= 1
            if entry.users <= 0 and key is not None:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
