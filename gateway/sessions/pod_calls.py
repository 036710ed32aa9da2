"""The orchestrator's calls on a session's pods (``gateway.sessions.orchestrator``): the call
that runs the session from its committed tokens, its rounds with the idle timeout, each round as
the chunk the APIs stream, and the stored rounds a resumed stream sends again."""

from __future__ import annotations

import asyncio
import time

from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import FinishReason
from cascade.protocol.round_stats import RoundStats
from cascade.protocol.wire.convert import (
    acceptance_to_pb,
    draft_settings_to_pb,
    logprobs_from_pb,
    sampling_to_pb,
)
from cascade.serving.mesh.security import MeshSecurity
from cascade.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from gateway.sessions.assignment import OrchestratorSettings, RoundTimeout, SessionJob
from gateway.sessions.generation import GeneratedChunk


def session_call(request: GenerationRequest, job: SessionJob, generated: list[int], channel,
                 mesh: MeshSecurity, memory_scope: str | None, scope: str):
    """The session's call on its pods from its committed tokens: ``Drafter.RunSession``, or
    ``Verifier.Decode`` when it has no drafter."""
    session = verifier_pb2.SessionOpen(
        session_id=job.record.session_id, epoch=job.epoch,
        context_tokens=request.prompt_tokens + generated, prompt_len=job.record.prompt_len,
        sampling=sampling_to_pb(request.sampling),
        acceptance=acceptance_to_pb(request.acceptance),
        owner_tag=mesh.owner_tag(job.record.session_id, job.epoch),
        prefix_scope=scope)
    if job.drafter is None:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        return stub.Decode(verifier_pb2.DecodeRequest(session=session))
    run = drafter_pb2.RunSessionRequest(
        session_id=session.session_id, epoch=session.epoch,
        context_tokens=session.context_tokens, prompt_len=session.prompt_len,
        sampling=session.sampling, draft=draft_settings_to_pb(request.draft),
        verifier_address=job.verifier, acceptance=session.acceptance,
        owner_tag=session.owner_tag, memory_scope=memory_scope,
        prefix_scope=session.prefix_scope)
    return drafter_pb2_grpc.DrafterStub(channel).RunSession(run)


async def timed_rounds(call, job: SessionJob, settings: OrchestratorSettings):
    """The call's rounds; RoundTimeout when the next one is overdue (see the settings)."""
    rounds, limit, slowest = aiter(call), settings.first_round_timeout_s, 0.0
    while True:
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(anext(rounds), limit)
        except StopAsyncIteration:
            return
        except TimeoutError:
            pods = tuple(p for p in (job.drafter, job.verifier) if p)
            raise RoundTimeout(limit, pods) from None
        slowest = max(slowest, time.monotonic() - started)
        limit = max(settings.round_timeout_s, settings.round_timeout_factor * slowest)
        yield result


def chunk_of(result, session_id: str, tokens: list[int], finish: FinishReason | None,
             round_number: int) -> GeneratedChunk:
    """A relayed ``Round`` as the chunk the APIs stream."""
    return GeneratedChunk(session_id, tokens, finish, RoundStats.from_pb(result.stats),
                          tuple(result.drafted_tokens), round_number,
                          tuple(result.drafted_parents), tuple(result.path),
                          logprobs=logprobs_from_pb(result.logprobs),
                          prompt_logprobs=logprobs_from_pb(result.prompt_logprobs))


def stored_rounds(session_id: str, tokens: list[int], ends: list[int],
                  finish_reason: str | None) -> list[GeneratedChunk]:
    """A session's stored rounds as a resumed stream sends them again; the last carries
    ``finish_reason`` (that of an ended session)."""
    chunks = []
    for i, end in enumerate(ends):
        reason = finish_reason if i == len(ends) - 1 else None
        finish = FinishReason(reason) if reason in ("stop", "length") else None
        chunks.append(GeneratedChunk(session_id, tokens[ends[i - 1] if i else 0 : end],
                                     finish, round=i + 1, is_replayed=True))
    return chunks
