"""Appends a failover cannot lose: acknowledged by every replica in sync before the round is sent.

Sentinel promotes the replica it last saw furthest ahead, and what it saw can be a second old.
A round that one replica acknowledged (``WAIT 1``) is therefore lost when Sentinel promotes
another one, and a client that was sent that round then resumes past what Redis holds. Waiting
for *every* replica that is in sync closes that: whichever of them is promoted has the round.

A replica counts as in sync when the primary lists it ``online`` with its last acknowledgement
at most ``IN_SYNC_LAG_S`` old (replicas acknowledge every second). A replica that is resyncing
(after a restart) or hung is not waited for: it cannot be promoted before it catches up, and
waiting for it would stall every stream. The count is read from ``INFO replication`` at most
every ``REFRESH_S`` and read again when a WAIT falls short (a replica that just dropped).
"""

from __future__ import annotations

import time

import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError

from cascade.serving import metrics

IN_SYNC_LAG_S = 1
REFRESH_S = 0.5


class NotReplicated(RedisConnectionError):
    """An append the replicas did not acknowledge in time: the stream fails as if Redis were
    unreachable (UNAVAILABLE / 503), and the client resumes from what is replicated."""


def in_sync_replicas(info: dict) -> int:
    """How many replicas a primary's parsed ``INFO replication`` lists online and current."""
    return sum(1 for key, value in info.items()
               if key.startswith("slave") and isinstance(value, dict)
               and value.get("state") == "online" and int(value.get("lag", 0)) <= IN_SYNC_LAG_S)


class ReplicaWaiter:
    """Runs a session-store script and then WAITs for the replicas that are in sync (at least
    ``minimum``) on the same connection (WAIT counts that connection's writes)."""

    def __init__(self, client: redis.Redis, minimum: int, wait_ms: int = 1000,
                 tries: int = 5) -> None:
        """``wait_ms`` per WAIT, asked up to ``tries`` times in the same round trip (once
        acknowledged, a WAIT returns at once): a replica that is catching up lags a moment."""
        if minimum < 1:
            raise ValueError(f"minimum must be >= 1, got {minimum}")
        self.client, self.minimum, self.wait_ms, self.tries = client, minimum, wait_ms, tries
        self._in_sync, self._read_at = minimum, float("-inf")

    async def target(self, fresh: bool = False) -> int:
        """How many replicas an append waits for now."""
        if fresh or time.monotonic() - self._read_at > REFRESH_S:
            self._in_sync = in_sync_replicas(await self.client.info("replication"))
            self._read_at = time.monotonic()
        return max(self.minimum, self._in_sync)

    async def run(self, script, keys: list[str], args: list) -> int:
        """``script``'s result once replicated; NotReplicated if the replicas in sync did not
        all acknowledge it (a primary cut off from its replicas, or one a failover already
        replaced): the round must not reach the client, who would then hold a round a
        failover can lose. A negative result (nothing written) is returned at once."""
        target = await self.target()
        async with self.client.pipeline(transaction=False) as pipe:
            await script(keys=keys, args=args, client=pipe)
            for _ in range(self.tries):
                pipe.execute_command("WAIT", target, self.wait_ms)
            result, *acknowledged = await pipe.execute()
        if int(result) < 0 or int(acknowledged[-1]) >= target:
            return result
        if int(acknowledged[-1]) >= await self.target(fresh=True):  # a replica dropped out
            return result
        metrics.UNREPLICATED_APPENDS.inc()
        raise NotReplicated(f"{acknowledged[-1]} of {target} replicas acknowledged the round "
                            f"in {self.tries * self.wait_ms} ms")
