"""What the gateway's API layers (HTTP, gRPC) need from the session orchestrator."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from cascade.protocol.logprobs import TokenLogprobs
from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.settings import FinishReason
from cascade.protocol.round_stats import RoundStats
from cascade.serving.errors import DataLoss
from cascade.serving.errors import Overloaded as ResourceExhausted
from cascade.serving.errors import Unavailable

__all__ = ["AtCapacity", "GeneratedChunk", "GenerationFailed", "GenerationRequest", "Generator",
           "RequestRefused", "RoundsLost",
           "KeyAtLimit", "Overloaded", "ResumableGenerator", "SessionBusy", "StopGeneration",
           "stop_early"]


class Overloaded(Unavailable):
    """No drafter or verifier can take the session now (HTTP 503, gRPC UNAVAILABLE)."""


class AtCapacity(ResourceExhausted):
    """Every verifier's KV memory is taken (HTTP 429 with Retry-After, gRPC
    RESOURCE_EXHAUSTED): the request may succeed later, unchanged."""


class KeyAtLimit(ResourceExhausted):
    """The caller's API key is at one of its limits (HTTP 429 rate_limit_exceeded, gRPC
    RESOURCE_EXHAUSTED); see gateway.limits."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SessionBusy(ResourceExhausted):
    """A resumed session is still streamed by its gateway (HTTP 409, gRPC RESOURCE_EXHAUSTED)."""


class StopGeneration(Exception):
    """Thrown into a generation's stream by a consumer that ends it on purpose (a stop string
    matched): the session is recorded as finished with reason stop. A stream that is only closed
    was abandoned (the client went away) and is recorded as cancelled."""


async def stop_early(chunks: AsyncIterator) -> None:
    """End a generation the consumer has all it wants of (see ``StopGeneration``)."""
    athrow = getattr(chunks, "athrow", None)
    if athrow is None:
        return
    try:
        await athrow(StopGeneration())
    except (StopGeneration, StopAsyncIteration):
        pass


class RoundsLost(DataLoss):
    """The store has fewer rounds of the session than the client received (a Redis failover
    without ``--redis-wait-replicas`` lost them): continuing would not line up with the text
    the client has (gRPC DATA_LOSS, HTTP 409 ``rounds_lost``)."""


class RequestRefused(ValueError):
    """A pod refused the session's settings (INVALID_ARGUMENT): the request must change, so it
    is not retried (HTTP 400, gRPC INVALID_ARGUMENT), with the pod's message."""


class GenerationFailed(RuntimeError):
    """The session could not be completed, even after moving it (HTTP 500, gRPC INTERNAL)."""


@dataclass(frozen=True)
class GeneratedChunk:
    """Tokens committed in one round (already stored in Redis when this is yielded)."""

    session_id: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    stats: RoundStats = RoundStats()
    """What the round did (counts, timings, the block's origin); all zero for a replayed one.
    ``stats.num_accepted`` counts a prefix of token_ids."""
    drafted_tokens: tuple[int, ...] = ()
    """The round's drafted tokens, rejected ones included (empty when the target decoded alone)."""
    round: int = 0
    """1-based index of this chunk among the session's stored rounds (a stream's event id); 0
    where unknown."""
    drafted_parents: tuple[int, ...] = ()
    """A token tree's parent per drafted token (-1: a root child); empty for a chain."""
    path: tuple[int, ...] = ()
    """A token tree's accepted nodes, from a root child down."""
    logprobs: tuple[TokenLogprobs, ...] = ()
    """The target's log-probabilities of token_ids, when the request asked for them."""
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    """SamplingParams.prompt_logprobs asked, on the first round only (never on a replayed
    one): one per prompt token after the first."""
    is_replayed: bool = False
    """A stored round a resumed stream sends again (generated before, by some stream)."""


class Generator(Protocol):
    def generate(self, request: GenerationRequest) -> AsyncGenerator[GeneratedChunk, None]:
        """Stream the committed chunks of one generation; the last has a finish_reason. The
        caller closes the stream (``aclose``) when it stops reading early."""
        ...


class ResumableGenerator(Generator, Protocol):
    async def resume(self, session_id: str, caller: str, after_round: int = 0
                     ) -> tuple[GenerationRequest, AsyncGenerator[GeneratedChunk, None]]:
        """A stored session's request and whole stream (stored rounds, then the rest);
        SessionLost when it is unknown or ``caller`` (a key identity) did not start it;
        RoundsLost when fewer than ``after_round`` (what the client has) are stored."""
        ...
