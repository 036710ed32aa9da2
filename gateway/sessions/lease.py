"""A gateway's hold on a session it streams: the lease it renews, the consumer it watches.

The gateway that streams a session renews its lease (gateway.sessions.session_store) so that no other
gateway takes it over. It stops, and gives the session up, when the stream's consumer stops
taking rounds: a client that no longer reads would otherwise hold the session, its lease and
the verifier's KV cache for as long as its connection stays open. Given up, the session is
recorded ``cancelled`` and its pods' call is cancelled, so the client can resume it later, on
any gateway, from what is stored.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

from gateway.sessions.assignment import SessionJob
from gateway.sessions.generation import GenerationFailed, SessionBusy
from gateway.sessions.session_store import LeaseHeld, SessionEnded, SessionStore

log = logging.getLogger(__name__)


class ConsumerIdle(GenerationFailed):
    """The stream's consumer took no round for ``idle_timeout_s``: the session was given up
    (recorded cancelled, resumable)."""


def redacted(session_id: str) -> str:
    """A session id as logs show it: enough to tell sessions apart, not enough to name one
    (ids are capabilities for whoever holds the key that started them)."""
    return f"{session_id[:6]}…"


async def keep_lease(store: SessionStore, job: SessionJob, idle_timeout_s: float,
                     give_up) -> None:
    """Renew ``job``'s lease while it streams; once a round has waited ``idle_timeout_s`` for
    its consumer, await ``give_up(job)`` and stop renewing."""
    while True:
        await asyncio.sleep(min(store.lease_s / 3, idle_timeout_s / 2))
        if job.offered_at is not None and time.monotonic() - job.offered_at > idle_timeout_s:
            log.warning("session %s: no round taken for %.0fs; giving it up",
                        redacted(job.record.session_id), idle_timeout_s)
            job.is_abandoned = True
            await give_up(job)
            return
        try:
            if not await store.renew(job.record.session_id, job.epoch):
                return  # another epoch owns it now; its appends will fail too
        except RedisError as exc:
            log.warning("lease renewal of %s failed: %s", redacted(job.record.session_id), exc)


async def take_over(store: SessionStore, session_id: str) -> int | None:
    """This gateway's epoch for the session, or None when it has ended (replay only);
    waits out a live lease (its stream may still be running to an older connection)."""
    deadline = time.monotonic() + 2 * store.lease_s + 1.0
    while True:
        try:
            return await store.takeover(session_id)
        except SessionEnded:
            return None
        except LeaseHeld:
            if time.monotonic() > deadline:
                raise SessionBusy(f"session {session_id} is still being streamed; retry when "
                                  "that stream has ended") from None
            await asyncio.sleep(0.5)
