"""The session orchestrator: assigns pods, persists every committed chunk, moves failed sessions.

For each generation: pick the least-loaded drafter and verifier from the registry, create the
session in Redis, and run it on the drafter (or on the verifier alone when k = 0 or no drafter
is alive). Every round's tokens are appended to Redis (epoch- and length-checked) *before* they
are yielded to the client. If a pod fails mid-stream, the pods that no longer answer health
checks are excluded, the epoch is bumped, and the session restarts from its committed tokens on
other pods; what the client already has is a prefix of the final output.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

import grpc
import redis.asyncio as redis

from opentelemetry import context as otel_context
from opentelemetry import trace

from cascade.protocol.limits import shortened
from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import FinishReason
from cascade.protocol.wire.convert import FINISH_FROM_PB
from cascade.serving import metrics
from cascade.serving.channels import ChannelPool
from cascade.serving.telemetry import start_span, tracer
from gateway.sessions.generation import (
    GeneratedChunk,
    GenerationFailed,
    RoundsLost,
    StopGeneration,
)
from gateway.sessions.affinity import PromptAffinity
from gateway.sessions.assignment import LatencyClock, OrchestratorSettings, SessionJob
from gateway.sessions.lease import ConsumerIdle, keep_lease, redacted, take_over
from gateway.sessions.session_store import (
    EpochBehind,
    LengthMismatch,
    SessionLost,
    SessionRecord,
    SessionStore,
    request_from_record,
)
from gateway.sessions.pod_calls import chunk_of, session_call, stored_rounds, timed_rounds
from gateway.sessions.pods import PodPicker
from gateway.sessions.recovery import Recovery
from gateway.sessions.sharing import MemorySharing, prefix_scope

log = logging.getLogger(__name__)


class Orchestrator:
    def __init__(self, client: redis.Redis, store: SessionStore, channels: ChannelPool,
                 settings: OrchestratorSettings = OrchestratorSettings()) -> None:
        self.client, self.store, self.channels, self.settings = client, store, channels, settings
        self._tasks: set[asyncio.Task] = set()
        self.pods = PodPicker(client, channels, settings)
        self.recovery = Recovery(store, self.pods, settings, self._give_up)
        self.affinity = PromptAffinity()
        """The pods of prompts being generated (their sessions share the prefill)."""
        self.memory = MemorySharing(client, settings.memory, settings.model_name,
                                    settings.memory_stream_len, settings.memory_stream_bytes)

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GeneratedChunk, None]:
        return self._observed(request, lambda context, ending: self._generate(
            request, context, ending))

    async def resume(self, session_id: str, caller: str, after_round: int = 0
                     ) -> tuple[GenerationRequest, AsyncGenerator[GeneratedChunk, None]]:
        """A stored session's generation and its whole stream: every stored round replayed as
        it was sent (the caller's detokenizer needs them all; it skips what its client has),
        then, unless it has ended, its continuation (this gateway takes it over once the owner's
        lease has expired). SessionLost if unknown, or if ``caller`` (a key identity) is not
        the key that started it: the same answer, so ids are never confirmed to other keys.
        RoundsLost if fewer than ``after_round`` rounds (what the client has) are stored."""
        fields = await self.store.record(session_id)
        known = bool(fields) and "request" in fields
        if not known or not secrets.compare_digest(fields.get("caller", ""), caller):
            raise SessionLost(f"no session {shortened(session_id)!r} (it never existed or has "
                              "expired)")
        if after_round and len(await self.store.round_ends(session_id)) < after_round:
            raise RoundsLost(f"session {session_id} has fewer stored rounds than the {after_round}"
                             " the client received (Redis lost them in a failover; gateways "
                             "with --redis-wait-replicas 1 prevent it): start the request again")
        request = request_from_record(fields)
        return request, self._observed(request, lambda context, ending: self._resumed(
            session_id, request, context, ending))

    async def _observed(self, request, inner_for) -> AsyncGenerator[GeneratedChunk, None]:
        """``inner_for(trace context, ending)``'s chunks, with the span, metrics, and the
        session's final status when the consumer ends it early."""
        span = tracer.start_span("generate", attributes={
            "num_prompt_tokens": len(request.prompt_tokens),
            "num_draft_tokens": request.num_draft_tokens})
        metrics.REQUESTS_RUNNING.inc()
        metrics.PROMPT_TOKENS.inc(len(request.prompt_tokens))
        started = time.perf_counter()
        finish, ending = "error", {"status": "cancelled", "reason": ""}
        inner = inner_for(trace.set_span_in_context(span), ending)
        try:
            async for chunk in inner:
                try:
                    yield chunk
                except StopGeneration:  # the consumer ended it on purpose (a stop string)
                    finish, ending["status"], ending["reason"] = "stop", "finished", "stop"
                    return
                finish = chunk.finish_reason.value if chunk.finish_reason else finish
        except (GeneratorExit, asyncio.CancelledError):
            finish = "abort"  # the client went away
            raise
        finally:
            try:
                await inner.aclose()  # a session ended early records its final status here
            finally:  # even when closing is cancelled (a hung Redis past the close timeout)
                metrics.REQUESTS_RUNNING.dec()
                metrics.REQUESTS_FINISHED.labels(finished_reason=finish).inc()
                metrics.E2E_REQUEST_LATENCY.observe(time.perf_counter() - started)
                span.end()

    async def _generate(self, request, trace_context, ending: dict
                        ) -> AsyncGenerator[GeneratedChunk, None]:
        key = PromptAffinity.key(request.group, request.prompt_tokens,
                                 request.num_draft_tokens > 0)
        try:
            drafter, verifier = await self.affinity.pick(
                key, lambda: self.pods.pick(request, set()),
                lambda pods: not set(pods) & self.pods.cooling_now())
            record = await self.store.create(request, drafter or "", verifier)
            job = SessionJob(record, record.epoch, drafter, verifier, trace_context)
            async with aclosing(self._drive(request, job, [], ending)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self.affinity.release(key)

    async def _resumed(self, session_id: str, request, trace_context, ending: dict
                       ) -> AsyncGenerator[GeneratedChunk, None]:
        epoch = await take_over(self.store, session_id)
        fields = await self.store.record(session_id)
        tokens, ends = await self.store.tokens(session_id), await self.store.round_ends(session_id)
        complete = request.sampling.finish_after(tokens)
        if epoch is not None and complete is not None:  # its final round was never recorded
            await self.store.finish(session_id, epoch, "finished", complete.value)
            fields, epoch = {**fields, "finish_reason": complete.value}, None
        replay = stored_rounds(session_id, tokens, ends, None if epoch is not None
                                else fields.get("finish_reason"))
        if epoch is None:
            for chunk in replay:
                yield chunk
            if fields.get("status") == "failed":
                raise GenerationFailed(f"session {session_id} failed")
            return
        drafter, verifier = await self.pods.pick(request, set())
        record = SessionRecord(session_id, epoch, int(fields["prompt_len"]))
        job = SessionJob(record, epoch, drafter, verifier, trace_context, round_ends=ends)
        job.epoch = await self.recovery.reassign(request, job, tokens)
        async with aclosing(self._drive(request, job, tokens, ending, replay)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _drive(self, request, job: SessionJob, generated: list[int], ending: dict,
                     replay: Sequence[GeneratedChunk] = ()) -> AsyncGenerator[GeneratedChunk, None]:
        """Run the session on its pods (after sending ``replay``, stored rounds, again), moving
        it after failures, holding its lease while its consumer keeps taking rounds."""
        clock = LatencyClock()
        lease = asyncio.get_running_loop().create_task(keep_lease(
            self.store, job, self.settings.idle_timeout_s, self._give_up_idle))
        try:
            for chunk in replay:
                job.offered_at = time.monotonic()
                yield chunk
                self._taken(job)
            for attempt in range(1, self.settings.max_attempts + 1):
                try:
                    async with aclosing(self._run(request, job, generated)) as rounds:
                        async for chunk in rounds:
                            clock.observe(chunk)
                            job.offered_at = time.monotonic()
                            yield chunk
                            self._taken(job)
                    return
                except (grpc.aio.AioRpcError, ConnectionError) as exc:
                    if job.is_abandoned:
                        raise ConsumerIdle(self._idle_message(job)) from exc
                    await self.recovery.recover(request, job, exc, attempt, generated)
        except GeneratorExit:  # closed before its last round: stopped or abandoned
            if not (job.is_finished or job.is_abandoned):
                await self._mark(job, ending["status"], ending["reason"])
            raise
        except asyncio.CancelledError:  # the request's task was cancelled (client went away)
            if not (job.is_finished or job.is_abandoned):
                self._background(self._mark(job, "cancelled"))
            raise
        finally:
            lease.cancel()

    def _taken(self, job: SessionJob) -> None:
        """The consumer took the round offered (``job.offered_at``: the lease keeper gives the
        session up when one waits too long); ConsumerIdle if it came back too late."""
        job.offered_at = None
        if job.is_abandoned:
            raise ConsumerIdle(self._idle_message(job))

    def _idle_message(self, job: SessionJob) -> str:
        return (f"No round was read for {self.settings.idle_timeout_s:.0f}s: the session was "
                f"given up; resume {job.record.session_id} to continue it.")

    async def _give_up_idle(self, job: SessionJob) -> None:
        if job.call is not None:
            job.call.cancel()  # the pods free the session's KV cache
        await self._mark(job, "cancelled")

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Let final-status writes still running finish (before the process exits)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    def _background(self, work) -> None:
        """Run ``work`` to its end even though the caller is being cancelled."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mark(self, job: SessionJob, status: str, reason: str = "") -> None:
        """Record a final status; a Redis error only costs the record its status (logged)."""
        try:
            await self.store.finish(job.record.session_id, job.epoch, status, reason)
        except Exception as exc:  # noqa: BLE001 - the tokens are stored; the stream must not fail
            log.warning("could not mark session %s %s: %s", redacted(job.record.session_id),
                        status, exc)

    async def _run(self, request, job: SessionJob, generated: list[int]):
        with self.channels.using(job.drafter or job.verifier) as channel:
            token = otel_context.attach(job.trace_context)  # the call carries the trace
            try:
                call = job.call = session_call(
                    request, job, generated, channel, self.channels.mesh,
                    self.memory.scope(request), self._scope(request))
            finally:
                otel_context.detach(token)
            try:
                async for chunk in self._committed(request, job, generated, call):
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
            finally:
                call.cancel()  # the client went away, or the stream failed: free the pods
        raise ConnectionError("the session stream ended before the generation finished")

    async def _committed(self, request, job: SessionJob, generated: list[int], call):
        """The call's rounds, each stored before it is yielded."""
        async for result in timed_rounds(call, job, self.settings):
            tokens, finish = list(result.tokens), FINISH_FROM_PB[result.finish_reason]
            with start_span("commit", job.trace_context, session_id=job.record.session_id,
                            round=result.round, num_tokens=len(tokens)):
                await self._commit(request, job, generated, tokens, finish)
            generated.extend(tokens)
            job.round_ends.append(len(generated))
            job.is_finished = finish is not None
            if job.is_finished:
                self._background(self.memory.remember(request, generated))
                self._background(self.pods.prefixes.served(
                    request.prompt_tokens + generated, self._scope(request), job.verifier,
                    job.drafter))
            yield chunk_of(result, job.record.session_id, tokens, finish, len(job.round_ends))

    async def _commit(self, request, job: SessionJob, generated: list[int],
                      tokens: list[int], finish: FinishReason | None) -> None:
        """Store a round's tokens (the final one records the session finished with them); when
        Redis lost earlier writes (restarted without the last second of its append-only file:
        tokens, or an epoch bump), write back everything the gateway holds."""
        session_id, reason = job.record.session_id, finish.value if finish else ""
        try:
            await self.store.append(session_id, job.epoch, len(generated), tokens, reason)
        except (SessionLost, LengthMismatch, EpochBehind) as exc:
            log.warning("session %s: %s; re-writing the %d tokens the gateway holds",
                        redacted(session_id), type(exc).__name__, len(generated) + len(tokens))
            await self.store.restore(session_id, request, job.epoch, job.drafter or "",
                                     job.verifier, generated + tokens,
                                     [*job.round_ends, len(generated) + len(tokens)], reason)

    def _scope(self, request: GenerationRequest) -> str:
        return prefix_scope(self.settings.prefix_sharing, request.caller)

    async def _give_up(self, job: SessionJob) -> None:
        await self._mark(job, "failed")
