"""Moving a session after a failure (``gateway.sessions.orchestrator``): which failures are
retried, which pods are passed over (dead ones, hung ones cooling down, a full verifier), the
wait for a live verifier, and the new epoch on the new pods, with what the gateway holds written
back when Redis lost it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from gateway.sessions.assignment import OrchestratorSettings, RoundTimeout, SessionJob
from gateway.sessions.generation import AtCapacity, GenerationFailed, Overloaded, RequestRefused
from gateway.sessions.lease import redacted
from gateway.sessions.pods import PodPicker
from gateway.sessions.session_store import EpochBehind, SessionLost, SessionStore

log = logging.getLogger(__name__)
RETRY_BACKOFF_S = 0.1
"""Wait before the n-th retry of a failed session: this times 2 ** (n - 1) (a link that drops
refuses new connections for a moment)."""
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED}


class Recovery:
    def __init__(self, store: SessionStore, pods: PodPicker, settings: OrchestratorSettings,
                 give_up: Callable[[SessionJob], Awaitable[None]]) -> None:
        """``give_up``: records a session failed (the orchestrator's final status write)."""
        self.store, self.pods, self.settings, self.give_up = store, pods, settings, give_up

    async def recover(self, request, job: SessionJob, exc: Exception, attempt: int,
                      generated: list[int]) -> None:
        """Move the session after a retryable failure; a full verifier (RESOURCE_EXHAUSTED)
        sends it to another one, and when none has room the client hears 429."""
        rpc = exc if isinstance(exc, grpc.aio.AioRpcError) else None
        code = rpc.code() if rpc else grpc.StatusCode.UNAVAILABLE
        details = rpc.details() if rpc else str(exc)
        log.warning("session %s attempt %d (drafter %s, verifier %s) failed: %s",
                    redacted(job.record.session_id), attempt, job.drafter, job.verifier, exc)
        full = code is grpc.StatusCode.RESOURCE_EXHAUSTED
        if (code not in RETRYABLE and not full) or attempt == self.settings.max_attempts:
            await self.give_up(job)
            if full:
                raise AtCapacity(details) from exc
            if code is grpc.StatusCode.INVALID_ARGUMENT:
                raise RequestRefused(f"The request was refused: {details}") from exc
            raise GenerationFailed(f"session {job.record.session_id} failed: {code.name}") from exc
        if full:
            exclude = {job.verifier}
        elif isinstance(exc, RoundTimeout):  # hung pods still answer health: cool them down
            self.pods.cool_down(exc.pods)
            exclude = set()
        else:
            dead = {a for a in (job.drafter, job.verifier)
                    if a and not await self.pods.is_serving(a)}
            # Both answer the gateway: the link between them failed (the drafter reaches the
            # verifier for the session), so this session goes on without that drafter.
            job.excluded |= dead or ({job.drafter} if job.drafter else set())
            exclude = job.excluded
            await asyncio.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))
        try:
            job.drafter, job.verifier = await (
                self.pods.pick(request, exclude) if full else
                self.pods.repick(request, job, exclude))
        except Overloaded:
            await self.give_up(job)
            if full:
                raise AtCapacity(details) from exc
            raise
        job.epoch = await self.reassign(request, job, generated)

    async def reassign(self, request, job: SessionJob, generated: list[int]) -> int:
        """The session's next epoch on its new pods; when Redis lost its record or an epoch
        bump (a failover to a replica that had not received them), what the gateway holds is
        written back first."""
        session_id, drafter = job.record.session_id, job.drafter or ""
        try:
            return await self.store.reassign(session_id, job.epoch, drafter, job.verifier)
        except (SessionLost, EpochBehind) as exc:
            log.warning("session %s: %s; re-writing the %d tokens the gateway holds",
                        redacted(session_id), type(exc).__name__, len(generated))
            await self.store.restore(session_id, request, job.epoch, drafter, job.verifier,
                                     generated, list(job.round_ends))
            return await self.store.reassign(session_id, job.epoch, drafter, job.verifier)
