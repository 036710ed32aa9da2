"""Client channels, one per peer address, reused across sessions.

A channel nobody has used for ``idle_close_s`` (no stream holds it through ``using``, no call
took it from ``get``) is closed: pods come and go (rescheduled, scaled in), and channels to
dead ones would otherwise stay open for the life of the process.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from cascade.serving.mesh.security import OPEN, MeshSecurity
from cascade.serving.server import KEEPALIVE_OPTIONS, MAX_MESSAGE_BYTES

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    *KEEPALIVE_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.use_local_subchannel_pool", 1),
]
"""A channel whose peer went away fails calls at once until it reconnects; it tries again
within a second at most (gRPC's default waits up to 120 s), so a pod restarted at the same
address is reachable again from every peer within about a second. Its connections are its own
(a local subchannel pool): a new channel to an address whose earlier peer went away does not
inherit another channel's failed connection and its backoff (by default gRPC shares them
process-wide, and a call on the new channel failed at once with "Connection refused" though a
server was listening there again)."""


class ChannelPool:
    def __init__(self, mesh: MeshSecurity = OPEN, idle_close_s: float = 300.0) -> None:
        self.mesh, self.idle_close_s = mesh, idle_close_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._users: Counter[str] = Counter()
        """address -> streams holding its channel now (``using``)."""
        self._last_used: dict[str, float] = {}
        self._closing: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._channels)

    def get(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address``, for a call that ends soon (a health check)."""
        self._close_idle()
        self._last_used[address] = time.monotonic()
        if address not in self._channels:
            self._channels[address] = self.mesh.channel(address, CHANNEL_OPTIONS)
        return self._channels[address]

    @contextmanager
    def using(self, address: str) -> Iterator[grpc.aio.Channel]:
        """The channel to ``address``, kept open while the block runs (a long stream)."""
        channel = self.get(address)
        self._users[address] += 1
        try:
            yield channel
        finally:
            self._users[address] -= 1
            self._last_used[address] = time.monotonic()

    def _close_idle(self) -> None:
        horizon = time.monotonic() - self.idle_close_s
        idle = [a for a, when in self._last_used.items() if when < horizon and not self._users[a]]
        for address in idle:
            del self._last_used[address]
            self._users.pop(address, None)
            task = asyncio.get_running_loop().create_task(self._channels.pop(address).close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
