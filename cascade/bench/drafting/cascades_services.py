"""The cascades evaluation on the services: each speculative method's prompts through the
gateway's gRPC API of a local cluster (verifier and drafter pinned to their own cores, as in
``cascade bench compare``), for wall-clock tokens/s and a check that the services emit the same
tokens as the in-process loop (greedy decoding is deterministic on both paths).

The classic cascade has no service path (it is not speculative), so it is measured in one
process only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from cascade.bench.drafting.cascades_eval import Method
from cascade.bench.prompts import BenchPrompt
from cascade.bench.compare.services import pinned_cluster, place_helpers
from cascade.v1 import gateway_pb2, gateway_pb2_grpc


@dataclass(frozen=True)
class ServiceRun:
    tokens_per_s: float
    outputs: list[list[int]]


def request_for(method: Method, prompt: BenchPrompt, k: int, max_tokens: int
                ) -> gateway_pb2.GenerateRequest:
    request = gateway_pb2.GenerateRequest(prompt=prompt.text, chat=prompt.chat,
                                          num_draft_tokens=k, max_tokens=max_tokens,
                                          temperature=0.0)
    if method.name != "lossless":
        request.acceptance, request.cascade_rule = "cascade", method.name
        request.cascade_alpha = method.knob
    return request


def generate(stub, request: gateway_pb2.GenerateRequest) -> list[int]:
    return [t for response in stub.Generate(request, timeout=600) for t in response.token_ids]


def run_on_services(target: Path, drafter: Path, prompts: list[BenchPrompt], k: int,
                    max_tokens: int, methods: list[Method], workdir: Path,
                    progress: Callable[[Method, ServiceRun], None] = lambda m, r: None
                    ) -> dict[Method, ServiceRun]:
    """Tokens/s and outputs of every speculative method on a fresh local cluster."""
    runs = {}
    with pinned_cluster(target, drafter, workdir) as (cluster, pins), \
            grpc.insecure_channel(cluster.grpc_address) as channel:
        place_helpers(cluster, pins, verifier_waits=False)  # its drafter speculates
        stub = gateway_pb2_grpc.GatewayStub(channel)
        generate(stub, request_for(Method("lossless", 0.0), prompts[0], k, max_tokens))
        for method in methods:
            runs[method] = _measure(stub, method, prompts, k, max_tokens)
            progress(method, runs[method])
    return runs


def _measure(stub, method: Method, prompts: list[BenchPrompt], k: int, max_tokens: int
             ) -> ServiceRun:
    started = time.perf_counter()
    outputs = [generate(stub, request_for(method, p, k, max_tokens)) for p in prompts]
    seconds = time.perf_counter() - started
    return ServiceRun(round(sum(map(len, outputs)) / seconds, 2), outputs)
