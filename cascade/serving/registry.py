"""The registry of live pods in Redis: heartbeat keys with a TTL, read by the gateway.

A pod writes ``cascade:pod:<role>:<address>`` = {"address", "load"} every ``interval_s`` with a
TTL of ``ttl_s``; a pod that dies disappears when its key expires. The gateway picks the pod
with the least load (active sessions).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as redis

log = logging.getLogger(__name__)
KEY_PREFIX = "cascade:pod:"


@dataclass(frozen=True)
class PodInfo:
    role: str
    address: str
    load: int


def pod_key(role: str, address: str) -> str:
    return f"{KEY_PREFIX}{role}:{address}"


class Heartbeat:
    """Keeps one pod's registry key alive while the pod serves."""

    def __init__(self, client: redis.Redis, role: str, address: str,
                 load: Callable[[], int], interval_s: float = 1.0, ttl_s: float = 5.0) -> None:
        self.client, self.role, self.address, self.load = client, role, address, load
        self.interval_s, self.ttl_s = interval_s, ttl_s
        self._task: asyncio.Task | None = None

    async def beat(self) -> None:
        value = json.dumps({"address": self.address, "load": self.load()})
        await self.client.set(pod_key(self.role, self.address), value, px=int(self.ttl_s * 1000))

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except redis.RedisError as exc:  # keep serving; the key lapses if Redis stays down
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        await self.beat()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Unregister first, so no new session is routed here while draining."""
        if self._task:
            self._task.cancel()
        try:
            await self.client.delete(pod_key(self.role, self.address))
        except redis.RedisError as exc:
            log.warning("could not unregister: %s", exc)


async def live_pods(client: redis.Redis, role: str) -> list[PodInfo]:
    keys = [key async for key in client.scan_iter(match=f"{KEY_PREFIX}{role}:*", count=100)]
    if not keys:
        return []
    pods = []
    for raw in await client.mget(keys):
        if raw is not None:
            value = json.loads(raw)
            pods.append(PodInfo(role, value["address"], int(value["load"])))
    return pods


async def least_loaded(client: redis.Redis, role: str, exclude: set[str] = frozenset()) -> str | None:
    """Address of the live pod of ``role`` with the least load, or None."""
    pods = [p for p in await live_pods(client, role) if p.address not in exclude]
    return min(pods, key=lambda p: (p.load, p.address)).address if pods else None
