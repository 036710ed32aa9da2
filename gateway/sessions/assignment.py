"""What the orchestrator keeps per session and its settings: the assignment (pods, epoch, round
ends), the round-timeout error, the latency clock that feeds the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context

from cascade.serving import metrics
from cascade.serving.memory_stream import DEFAULT_STREAM_BYTES, DEFAULT_STREAM_LEN, MemoryMode
from gateway.sessions.generation import GeneratedChunk
from gateway.sessions.session_store import SessionRecord
from gateway.sessions.sharing import PrefixSharing


@dataclass(frozen=True)
class OrchestratorSettings:
    max_attempts: int = 6
    """Assignments tried per session (the first one plus moves after failures, the n-th
    after a wait of 0.1 s * 2 ** (n - 2): about 3 s in all)."""
    first_round_timeout_s: float = 120.0
    """Longest wait for an assignment's first round (prefill, KV admission wait included)."""
    round_timeout_s: float = 30.0
    """Longest silence between later rounds before the pods are presumed hung; it grows to
    ``round_timeout_factor`` times the slowest round the session has seen. No deadline bounds a
    whole generation that keeps making progress."""
    round_timeout_factor: float = 10.0
    cooldown_s: float = 30.0
    """How long pods that hung are passed over when others can take the session."""
    pod_wait_s: float = 60.0
    """How long a session that lost its pods waits for a verifier when none is live (every
    verifier restarting at once) before it is given up."""
    idle_timeout_s: float = 60.0
    """Longest a round may wait for the stream's consumer (a client that stopped reading)
    before the session is given up: recorded cancelled, its pods freed, its lease let go
    (gateway.sessions.lease). The client can resume it."""
    memory: MemoryMode = MemoryMode.PER_KEY
    """The speculation memory (cascade.serving.memory_stream): whose finished generations a
    session's suffix methods draft from, and whether this gateway shares them."""
    memory_stream_len: int = DEFAULT_STREAM_LEN
    """Finished generations the memory's Redis stream keeps."""
    memory_stream_bytes: int = DEFAULT_STREAM_BYTES
    """Bytes the memory's Redis stream keeps (at most a quarter of Redis's maxmemory)."""
    model_name: str = ""
    """The served model's name, part of every memory scope."""
    prefix_sharing: PrefixSharing = PrefixSharing.PER_KEY
    """Whose live prompts a session's pods may copy KV prefixes from (gateway.sessions.sharing)."""


class RoundTimeout(ConnectionError):
    """No round arrived in time: the drafter or the verifier is hung (both are suspects)."""

    def __init__(self, waited_s: float, pods: tuple[str, ...]) -> None:
        super().__init__(f"no round for {waited_s:.1f}s from {', '.join(pods)}")
        self.pods = pods


@dataclass
class SessionJob:
    record: SessionRecord
    epoch: int
    drafter: str | None
    verifier: str
    trace_context: otel_context.Context
    excluded: set[str] = field(default_factory=set)
    """Pods that failed this session's health checks (a dead pod stays in the registry until
    its entry expires: it must not be picked again by a later move)."""
    round_ends: list[int] = field(default_factory=list)
    """Generated-token count after each stored round."""
    call: Any = None
    """The pods' gRPC call now running the session (cancelled when it is given up)."""
    offered_at: float | None = None
    """When (monotonic) the round now waiting for the consumer was offered; None: none waits."""
    is_abandoned: bool = False
    """Given up after its consumer went idle (gateway.sessions.lease)."""
    is_finished: bool = False
    """Its final round is stored (the record says finished)."""


class LatencyClock:
    """Per session: time to first token, then inter-token latency (a chunk's gap spread over
    its tokens), and each round's acceptance counts, as the client receives them."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.is_first = True

    def observe(self, chunk: GeneratedChunk) -> None:
        num_tokens = len(chunk.token_ids)
        now = time.perf_counter()
        gap = now - self.last
        if self.is_first:
            metrics.TIME_TO_FIRST_TOKEN.observe(gap)
            self.is_first = False
        else:
            for _ in range(num_tokens):
                metrics.INTER_TOKEN_LATENCY.observe(gap / num_tokens)
        metrics.GENERATION_TOKENS.inc(num_tokens)
        metrics.SPEC_STATS.observe_round(chunk.stats, num_tokens)
        self.last = now
