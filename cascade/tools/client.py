"""A small gRPC client of the gateway, used by ``cascade generate``: streams one generation and
summarises it (acceptance, tokens/s, per-round protocol overhead)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from cascade.protocol.stats import SpecStats
from cascade.v1 import gateway_pb2, gateway_pb2_grpc


@dataclass
class GenerationSummary:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    first_token_s: float = 0.0
    elapsed_s: float = 0.0
    overhead_us: list[int] = field(default_factory=list)
    """Per round: round wall time minus drafting and verification compute."""

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def num_rounds(self) -> int:
        return self.stats.num_target_passes

    def observe(self, response: gateway_pb2.GenerateResponse) -> None:
        self.text += response.text
        self.token_ids += response.token_ids
        self.stats.observe(response.num_drafted, response.num_accepted, len(response.token_ids),
                           response.num_deferred)
        if response.round_us:
            self.overhead_us.append(response.round_us - response.draft_us - response.verify_us)


def stream_generation(address: str, prompt: str, max_tokens: int, num_draft_tokens: int,
                      temperature: float = 0.0, seed: int = 0, chat: bool = True,
                      on_response: Callable[[gateway_pb2.GenerateResponse], None] | None = None,
                      timeout_s: float = 600.0, cascade_rule: str | None = None,
                      cascade_alpha: float = 0.0, adaptive: bool = False) -> GenerationSummary:
    """One generation through the gateway; ``cascade_rule`` makes it a speculative cascade,
    ``adaptive`` adapts k to the drafter's success."""
    cascade = {"acceptance": "cascade", "cascade_rule": cascade_rule,
               "cascade_alpha": cascade_alpha} if cascade_rule else {}
    schedule = {"draft_schedule": "adaptive"} if adaptive else {}
    request = gateway_pb2.GenerateRequest(prompt=prompt, num_draft_tokens=num_draft_tokens,
                                          chat=chat, max_tokens=max_tokens,
                                          temperature=temperature, seed=seed, **cascade,
                                          **schedule)
    summary = GenerationSummary()
    started = time.perf_counter()
    with grpc.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for response in stub.Generate(request, timeout=timeout_s):
            if summary.num_rounds == 0:
                summary.first_token_s = time.perf_counter() - started
            summary.observe(response)
            if on_response:
                on_response(response)
    summary.elapsed_s = time.perf_counter() - started
    return summary
