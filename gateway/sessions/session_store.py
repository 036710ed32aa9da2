"""Session state in Redis: the record, the committed tokens, and epoch fencing.

Keys (the {session_id} hash tag keeps both in one Redis Cluster slot, so the Lua scripts may touch
both atomically):

- ``cascade:session:{id}`` hash: request (JSON), status, drafter, verifier, epoch, prompt_len,
  caller (the digest of the API key that started it: only that key may resume it).
- ``cascade:session:{id}:tokens`` list: generated token ids, in order.
- ``cascade:session:{id}:rounds`` list: the token count after each stored round (the stream's
  chunk boundaries: a resumed stream replays them as they were sent).

The gateway that runs a session holds a lease on it (``owner``, ``lease_ms`` in the record),
renewed while it streams; another gateway takes a session over (``takeover``: a new epoch)
only when the lease has expired or the session was cancelled, so a client can resume it
anywhere after its gateway died.

Every write goes through a Lua script that first checks the epoch, so an owner that was paused
and replaced cannot write after the new one took over. Appends also check the expected length,
so a chunk is never stored twice or out of order, and a repeated append of the chunk just stored
succeeds without writing (so redis-py may retry appends after a lost reply). Everything carries
a TTL: ``ttl_s`` (an hour) while a session can go on (running, or cancelled and resumable), the
shorter ``finished_ttl_s`` (ten minutes, ``--finished-session-ttl-s``) once it has ended
(finished or failed), when all it is kept for is a client replaying it after a dropped
connection.

``connect`` (cascade.serving.registry) makes the client every gateway uses: explicit timeouts,
and redis-py's retries with exponential backoff on connection errors and timeouts (a stream
pauses for a Redis blip instead of failing).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass

import redis.asyncio as redis

from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy
from cascade.serving.errors import StaleEpoch
from cascade.serving.registry import as_text, connect
from gateway.sessions.replication import NotReplicated, ReplicaWaiter
from gateway.sessions.session_scripts import (
    APPEND_SCRIPT,
    CREATE_SCRIPT,
    RESTORE_SCRIPT,
    TAKEOVER_SCRIPT,
    RENEW_SCRIPT,
    SET_IF_EPOCH_SCRIPT,
    REASSIGN_SCRIPT,
)

__all__ = ["EpochBehind", "LeaseHeld", "LengthMismatch", "NotReplicated", "SessionEnded", "SessionLost", "SessionRecord",
           "SessionStore", "connect", "request_from_record", "session_keys"]

SESSION_TTL_S = 3600
"""How long a session that can go on is kept after its last write."""
FINISHED_SESSION_TTL_S = 600
"""How long an ended session is kept by default (for a client replaying it)."""
FINAL_STATUSES = ("finished", "failed")
"""Statuses after which a session only replays (a cancelled one can still be resumed)."""


class LengthMismatch(RuntimeError):
    """The stored token count differs from what the writer expected (nothing was written)."""


class SessionLost(RuntimeError):
    """The session's record is gone from Redis (nothing was written)."""


class EpochBehind(RuntimeError):
    """The stored epoch is older than the writer's: Redis lost an epoch bump (nothing was
    written; the writer re-writes what it holds)."""


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    epoch: int
    prompt_len: int


def _record_fields(request: GenerationRequest, epoch: int, drafter: str, verifier: str
                   ) -> dict[str, str | int]:
    body = {"prompt_tokens": request.prompt_tokens, "sampling": asdict(request.sampling),
            "draft": asdict(request.draft), "acceptance": asdict(request.acceptance)}
    return {"request": json.dumps(body), "status": "running", "epoch": epoch,
            "prompt_len": len(request.prompt_tokens), "drafter": drafter, "verifier": verifier,
            "caller": request.caller}


def request_from_record(fields: dict[str, str]) -> GenerationRequest:
    """The generation a stored record describes (for taking a session over)."""
    body = json.loads(fields["request"])

    def settings(kind, values: dict):
        return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    return GenerationRequest(list(body["prompt_tokens"]), settings(SamplingParams, body["sampling"]),
                             settings(DraftConfig, body["draft"]),
                             settings(AcceptancePolicy, body["acceptance"]),
                             fields.get("view", ""), fields.get("caller", ""))


def _flat(fields: dict[str, str | int]) -> list[str | int]:
    """A record's fields and values in turn (as HSET takes them)."""
    return [item for pair in fields.items() for item in pair]


def session_keys(session_id: str) -> tuple[str, str, str]:
    """(record hash, token list, round ends) keys of a session."""
    base = f"cascade:session:{{{session_id}}}"
    return base, f"{base}:tokens", f"{base}:rounds"


class LeaseHeld(RuntimeError):
    """Another gateway holds a live lease on the session (it is still streaming it)."""


class SessionEnded(RuntimeError):
    """The session has a final status: there is nothing to take over, only to replay."""


class SessionStore:
    def __init__(self, client: redis.Redis, ttl_s: int = SESSION_TTL_S, owner: str = "",
                 lease_s: float = 10.0, wait_replicas: int = 0, wait_ms: int = 1000,
                 wait_tries: int = 8, finished_ttl_s: int = FINISHED_SESSION_TTL_S) -> None:
        """``ttl_s``: how long a session that can go on is kept after its last write;
        ``finished_ttl_s``: how long one that has ended is (never longer than ``ttl_s``);
        ``owner``: this gateway's id in leases (a fresh one per process by default);
        ``wait_replicas``: each write of a record or of rounds (``create``, ``append``,
        ``restore``) returns once every replica in sync, and at least this many, has it
        (gateway.sessions.replication: Redis ``WAIT`` of at most ``wait_ms``, asked up to
        ``wait_tries`` times), so a session or a chunk a client was told of survives the
        primary's death even when the client moves to another gateway or its gateway dies
        too."""
        if finished_ttl_s <= 0:
            raise ValueError(f"finished_ttl_s must be positive, got {finished_ttl_s}")
        self.client, self.ttl_s, self.lease_s = client, ttl_s, lease_s
        self.finished_ttl_s = min(finished_ttl_s, ttl_s)
        self.waiter = (ReplicaWaiter(client, wait_replicas, wait_ms, wait_tries)
                       if wait_replicas else None)
        self.owner = owner or secrets.token_hex(6)
        self._takeover = client.register_script(TAKEOVER_SCRIPT)
        self._renew = client.register_script(RENEW_SCRIPT)
        self._append = client.register_script(APPEND_SCRIPT)
        self._set_if_epoch = client.register_script(SET_IF_EPOCH_SCRIPT)
        self._reassign = client.register_script(REASSIGN_SCRIPT)
        self._restore = client.register_script(RESTORE_SCRIPT)
        self._create = client.register_script(CREATE_SCRIPT)

    async def create(self, request: GenerationRequest, drafter: str, verifier: str) -> SessionRecord:
        session_id = secrets.token_hex(12)
        fields = self._fields(request, 1, drafter, verifier)
        await self._write(self._create, session_keys(session_id),
                          [self.ttl_s, self._lease_ms, *_flat(fields)])
        return SessionRecord(session_id, 1, len(request.prompt_tokens))

    async def append(self, session_id: str, epoch: int, expected_len: int, tokens: list[int],
                     finish_reason: str = "") -> int:
        """Append one round's tokens if the epoch and length match; returns the new length.
        ``finish_reason`` (the final round's) records the session finished in the same step."""
        keys = session_keys(session_id)
        ttl_s = self._ttl(bool(finish_reason))
        args = [epoch, expected_len, ttl_s, self._lease_ms, finish_reason, *tokens]
        result = await self._write(self._append, keys, args)
        if result == -1:
            raise StaleEpoch(f"session {session_id}: epoch {epoch} is no longer current")
        if result == -4:
            raise EpochBehind(f"session {session_id}: the stored epoch is older than {epoch}")
        if result == -2:
            raise LengthMismatch(f"session {session_id}: expected {expected_len} stored tokens")
        if result == -3:
            raise SessionLost(f"session {session_id}: its record is gone")
        return int(result)

    async def restore(self, session_id: str, request: GenerationRequest, epoch: int,
                      drafter: str, verifier: str, tokens: list[int],
                      round_ends: list[int], finish_reason: str = "") -> None:
        """Write back the record, the tokens and round ends the gateway holds (see
        RESTORE_SCRIPT); ``finish_reason``: the tokens end the generation."""
        record = self._fields(request, epoch, drafter, verifier)
        if finish_reason:
            record |= {"status": "finished", "finish_reason": finish_reason}
        fields = _flat(record)
        ttl_s = self._ttl(bool(finish_reason))
        result = await self._write(self._restore, session_keys(session_id),
                                   [epoch, ttl_s, len(fields), len(tokens), *fields,
                                    *tokens, *round_ends])
        if result == -1:
            raise StaleEpoch(f"session {session_id}: epoch {epoch} is no longer current")
        if result == -2:
            raise LengthMismatch(f"session {session_id}: stored tokens are not a prefix of "
                                 "the gateway's")

    def _ttl(self, has_ended: bool) -> int:
        """How long a session's keys are kept after this write."""
        return self.finished_ttl_s if has_ended else self.ttl_s

    async def _write(self, script, keys: tuple[str, ...], args: list) -> int:
        """``script``'s result; with ``wait_replicas``, once the replicas have what it wrote
        (a client hears of a session or a round only after that)."""
        if self.waiter is not None:
            return await self.waiter.write(script, list(keys), args)
        return await script(keys=keys, args=args)

    async def finish(self, session_id: str, epoch: int, status: str,
                     finish_reason: str = "") -> None:
        """Record a final status (or "cancelled"); an ended session's keys expire sooner."""
        ttl_s = self._ttl(status in FINAL_STATUSES)
        args: list[str | int] = [epoch, ttl_s, "status", status, "finish_reason", finish_reason]
        if not await self._set_if_epoch(keys=list(session_keys(session_id)), args=args):
            raise StaleEpoch(f"session {session_id}: epoch {epoch} is no longer current")

    async def reassign(self, session_id: str, epoch: int, drafter: str, verifier: str) -> int:
        """Bump the epoch (fencing out the old assignment) and record the new pods."""
        record_key = session_keys(session_id)[0]
        result = await self._reassign(keys=[record_key], args=[epoch, drafter, verifier])
        if result == -1:
            raise StaleEpoch(f"session {session_id}: epoch {epoch} is no longer current")
        if result == -4:
            raise EpochBehind(f"session {session_id}: the stored epoch is older than {epoch}")
        if result == -3:
            raise SessionLost(f"session {session_id}: its record is gone")
        return int(result)

    def _fields(self, request: GenerationRequest, epoch: int, drafter: str, verifier: str
                ) -> dict[str, str | int]:
        """The record as this gateway writes it: the request and assignment, the owner, the
        API layer's view (the lease is set by Redis's clock, in the scripts)."""
        return {**_record_fields(request, epoch, drafter, verifier), "owner": self.owner,
                "view": request.view}

    @property
    def _lease_ms(self) -> int:
        return int(self.lease_s * 1000)

    async def renew(self, session_id: str, epoch: int) -> bool:
        """Extend this gateway's lease; False once another epoch owns the session."""
        return bool(await self._renew(keys=[session_keys(session_id)[0]],
                                      args=[epoch, self._lease_ms]))

    async def takeover(self, session_id: str) -> int:
        """A new epoch owned by this gateway (LeaseHeld, SessionEnded, SessionLost if not)."""
        result = await self._takeover(keys=[session_keys(session_id)[0]],
                                      args=[self.owner, self._lease_ms])
        if result == -1:
            raise LeaseHeld(f"session {session_id} is still streamed by another gateway")
        if result == -2:
            raise SessionEnded(f"session {session_id} has ended")
        if result == -3:
            raise SessionLost(f"session {session_id} does not exist (or has expired)")
        return int(result)

    async def round_ends(self, session_id: str) -> list[int]:
        return [int(n) for n in await self.client.lrange(session_keys(session_id)[2], 0, -1)]

    async def tokens(self, session_id: str) -> list[int]:
        return [int(t) for t in await self.client.lrange(session_keys(session_id)[1], 0, -1)]

    async def record(self, session_id: str) -> dict[str, str]:
        raw = await self.client.hgetall(session_keys(session_id)[0])
        return {as_text(k): as_text(v) for k, v in raw.items()}
