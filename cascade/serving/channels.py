"""Client channels, one per peer address, reused across sessions."""

from __future__ import annotations

import grpc

from cascade.serving.mesh import OPEN, MeshSecurity
from cascade.serving.server import KEEPALIVE_OPTIONS, MAX_MESSAGE_BYTES

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    *KEEPALIVE_OPTIONS,
]


class ChannelPool:
    def __init__(self, mesh: MeshSecurity = OPEN) -> None:
        self.mesh = mesh
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = self.mesh.channel(address, CHANNEL_OPTIONS)
        return self._channels[address]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
