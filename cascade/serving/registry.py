"""The registry of live pods in Redis: one hash per role, read by the gateway.

A pod keeps the field ``<address>`` of the hash ``cascade:pods:<role>`` set to
``{"load": n, "expires_ms": t, ...facts}`` every ``interval_s`` (facts: what it serves, e.g.
``"dtype": "bfloat16"``), where ``t`` is Redis's own clock plus
``ttl_s`` (one clock for every pod and gateway, so skew between machines does not matter). A pod
that dies stops renewing and counts as gone once its expiry passes; readers delete such fields
as they meet them. Reading a role is one ``HGETALL`` (no keyspace scan); a malformed field is
logged and skipped, never fatal. The gateway picks the least-loaded pod (active sessions), ties
broken at random so that bursts from several gateways spread out.

A pod starts and serves while Redis is down: its heartbeat keeps trying, and it registers when
Redis comes back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from cascade.serving.redis_url import is_sentinel, parse_sentinel

log = logging.getLogger(__name__)
KEY_PREFIX = "cascade:pods:"

_FORGET = """
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then redis.call('HDEL', KEYS[1], ARGV[i]) end
end
"""
"""Delete expired entries unless a renewal replaced them since they were read."""
_BEAT = """
local now = redis.call('TIME')
local expires = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[3])
local entry = cjson.decode(ARGV[4])
entry.load = tonumber(ARGV[2])
entry.expires_ms = expires
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(entry))
return expires
"""


SENTINEL_RETRIES = 20
"""A sentinel client's retries (about 18 s): a failover takes the sentinels' down-after time
plus an election and a promotion, several seconds on a loaded machine, and an election that
splits its votes is tried again after the failover timeout."""


def as_text(value: bytes | str) -> str:
    """A Redis reply as text (``connect``'s clients answer bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def connect(url: str, timeout_s: float = 2.0, retries: int = 5) -> redis.Redis:
    """A client with explicit timeouts and backoff retries (about 3 s of retrying in all), so
    a Redis restart costs a pause, not a failed call; every service uses it. A
    ``redis+sentinel://`` URL (cascade.serving.redis_url) gives a client of the primary the
    sentinels name, which finds the new primary after a failover (within its retries, at
    least ``SENTINEL_RETRIES``)."""
    if is_sentinel(url):
        retries = max(retries, SENTINEL_RETRIES)
    options = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                   retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), retries),
                   retry_on_error=[RedisConnectionError, RedisTimeoutError])
    if not is_sentinel(url):
        return redis.from_url(url, **options)
    address = parse_sentinel(url)
    sentinel = Sentinel(list(address.sentinels), sentinel_kwargs={
        "password": address.sentinel_password, "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s}, password=address.password, db=address.db,
        **options)
    return sentinel.master_for(address.service, connection_class=PrimaryConnection)


class PrimaryConnection(SentinelManagedConnection):
    """A connection to the primary the sentinels name, fixing two ways redis-py's own keeps
    talking to a primary that is gone:

    - every socket connect asks the sentinels where the primary is: redis-py's reconnects a
      connection that failed mid-command (the client's own retry) to its old address, so a
      command in flight when the primary died dialled the dead server until its retries ran
      out;
    - a script's READONLY error is taken for what it is: the server it reached was demoted (a
      primary that came back after a failover, a replica now). redis-py's only recognises a
      bare READONLY reply, so every Lua script of the session store would fail against the old
      primary forever. The connection is dropped and the error is a ConnectionError: the
      retry asks the sentinels again."""

    async def _connect(self):
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super()._connect()

    async def read_response(self, *args, **kwargs):
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if self.connection_pool.is_master and "READONLY" in str(exc):
                await self.disconnect()
                raise RedisConnectionError("the primary was demoted to a replica") from exc
            raise


@dataclass(frozen=True)
class PodInfo:
    role: str
    address: str
    load: int
    facts: dict = field(default_factory=dict)
    """What the pod said of itself beside its load (e.g. ``dtype``)."""


def role_key(role: str) -> str:
    return f"{KEY_PREFIX}{role}"


class Heartbeat:
    """Keeps one pod's registry entry alive while the pod serves."""

    def __init__(self, client: redis.Redis, role: str, address: str,
                 load: Callable[[], int], interval_s: float = 1.0, ttl_s: float = 5.0,
                 facts: dict[str, str] | None = None) -> None:
        self.client, self.role, self.address, self.load = client, role, address, load
        self.interval_s, self.ttl_s = interval_s, ttl_s
        self.facts = json.dumps(facts or {})
        self._task: asyncio.Task | None = None
        self._script = client.register_script(_BEAT)

    async def beat(self) -> None:
        await self._script(keys=[role_key(self.role)],
                           args=[self.address, int(self.load()), int(self.ttl_s * 1000),
                                 self.facts])

    async def _beat_logged(self) -> None:
        try:
            await self.beat()
        except redis.RedisError as exc:  # keep serving; the entry lapses if Redis stays down
            log.warning("heartbeat failed: %s", exc)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._beat_logged()

    async def start(self) -> None:
        """Register now (when Redis answers) and keep beating; never fails because Redis is
        down: the pod registers once it is back."""
        await self._beat_logged()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Unregister first, so no new session is routed here while draining."""
        if self._task:
            self._task.cancel()
        try:
            await self.client.hdel(role_key(self.role), self.address)
        except redis.RedisError as exc:
            log.warning("could not unregister: %s", exc)


async def live_pods(client: redis.Redis, role: str) -> list[PodInfo]:
    """The pods of ``role`` whose entries have not expired (expired ones are deleted)."""
    key = role_key(role)
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(key)
        pipe.time()
        entries, (seconds, micros) = await pipe.execute()
    now_ms = seconds * 1000 + micros // 1000
    pods, expired = [], []
    for entry, raw in entries.items():
        address = as_text(entry)
        try:
            value = json.loads(raw)
            load, expires_ms = int(value.pop("load")), int(value.pop("expires_ms"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("skipping malformed registry entry %s[%s]: %s", key, address, exc)
            continue
        if expires_ms < now_ms:
            expired += [entry, raw]
        else:
            pods.append(PodInfo(role, address, load, value))
    if expired:
        await client.eval(_FORGET, 1, key, *expired)
    return pods


async def least_loaded(client: redis.Redis, role: str,
                       exclude: Collection[str] = frozenset()) -> str | None:
    """Address of a live pod of ``role`` with the least load (random among equals), or None."""
    pods = [p for p in await live_pods(client, role) if p.address not in exclude]
    if not pods:
        return None
    lowest = min(p.load for p in pods)
    return random.choice([p.address for p in pods if p.load == lowest])
