"""Writes a failover cannot lose: every replica in sync acknowledges them before a client is told.

Sentinel promotes the replica it last saw furthest ahead, and what it saw can be a second old.
A round that one replica acknowledged (``WAIT 1``) is therefore lost when Sentinel promotes
another one, and a client that was sent that round then resumes past what Redis holds. Waiting
for *every* replica that is in sync closes that: whichever of them is promoted has the round.

A replica counts as in sync when the primary lists it ``online`` with its last acknowledgement
at most ``IN_SYNC_LAG_S`` old (replicas acknowledge every second). A replica that is resyncing
(after a restart) is not waited for: it rejoins unpromotable (``replica-priority 0`` until its
link is up; ``RedisHA.restart`` and the Kubernetes start script). One that is hung or starved of
CPU stays counted for those seconds, because Sentinel may still choose it while its last
answer is recent: streams pause that long, once, before it is left out. The count is read from
``INFO replication`` in the same round trip as each WAIT, for the next one.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError

from cascade.serving import metrics

IN_SYNC_LAG_S = 5


class NotReplicated(RedisConnectionError):
    """A write the replicas did not acknowledge in time: the stream fails as if Redis were
    unreachable (UNAVAILABLE / 503), and the client resumes from what is replicated."""


def in_sync_replicas(info: dict, max_lag_s: int = IN_SYNC_LAG_S) -> int:
    """How many replicas a primary's parsed ``INFO replication`` lists online and current."""
    return sum(1 for key, value in info.items()
               if key.startswith("slave") and isinstance(value, dict)
               and value.get("state") == "online" and int(value.get("lag", 0)) <= max_lag_s)


PROBE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('LLEN', KEYS[2]) < tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[3], ARGV[1], 'PX', 60000)
return 1
"""
"""A write after the write waited for, on whichever server is primary now, made only if that
server has it (KEYS[1] the session's record; KEYS[2] its token list, at least ARGV[1] long;
KEYS[3] the probe key): a WAIT after it, on any connection, covers the write."""


class ReplicaWaiter:
    """Runs one of the session store's writes (a record created, a round appended, rounds
    restored) and then WAITs, on the same connection (WAIT counts that
    connection's writes), for the replicas that are in sync, at least ``minimum``."""

    def __init__(self, client: redis.Redis, minimum: int, wait_ms: int = 1000,
                 tries: int = 8, max_lag_s: int = IN_SYNC_LAG_S) -> None:
        """``wait_ms`` per WAIT, asked up to ``tries`` times (long enough for a hung replica
        to fall ``max_lag_s`` behind and out of the count); the count of replicas in sync is
        read with every WAIT, so a replica that dropped out is not waited for again."""
        if minimum < 1:
            raise ValueError(f"minimum must be >= 1, got {minimum}")
        self.client, self.minimum, self.wait_ms, self.tries = client, minimum, wait_ms, tries
        self.max_lag_s = max_lag_s
        self._in_sync = minimum
        self._probe = client.register_script(PROBE_SCRIPT)

    @property
    def target(self) -> int:
        """How many replicas the next WAIT asks for."""
        return max(self.minimum, self._in_sync)

    async def write(self, script, keys: list[str], args: list) -> int:
        """``script``'s result (the length of the token list ``keys[1]`` after it, in the
        record ``keys[0]``) once replicated; NotReplicated if the replicas in sync did not all
        acknowledge it (a primary cut off from its replicas, or one a failover replaced): the
        write must not reach the client, who would then hold a session or a round a failover
        can lose. A negative result (nothing written) is returned at once."""
        async with self.client.pipeline(transaction=False) as pipe:
            await script(keys=keys, args=args, client=pipe)
            result, acknowledged, asked = await self._wait(pipe)
        if result < 0:
            return result
        for _ in range(self.tries - 1):
            if acknowledged >= self.target:
                return result
            async with self.client.pipeline(transaction=False) as pipe:
                await self._probe(keys=[*keys[:2], f"{keys[0]}:replicated"],
                                  args=[result], client=pipe)
                present, acknowledged, asked = await self._wait(pipe)
            if not present:  # the primary now lacks the write: a failover lost it (and
                raise self._unreplicated(acknowledged, asked)  # this WAIT covered no write)
        if acknowledged >= self.target:
            return result
        raise self._unreplicated(acknowledged, asked)

    def _unreplicated(self, acknowledged: int, asked: int) -> NotReplicated:
        metrics.UNREPLICATED_APPENDS.inc()
        return NotReplicated(f"{acknowledged} of {asked} replicas acknowledged the write in "
                             f"{self.tries * self.wait_ms} ms")

    async def _wait(self, pipe) -> tuple[int, int, int]:
        """Adds WAIT and INFO to ``pipe`` and runs it: (the first command's result, replicas
        that acknowledged, replicas asked for)."""
        asked = self.target
        pipe.execute_command("WAIT", asked, self.wait_ms)
        pipe.info("replication")
        first, acknowledged, info = await pipe.execute()
        self._in_sync = in_sync_replicas(info, self.max_lag_s)
        return int(first), int(acknowledged), asked
