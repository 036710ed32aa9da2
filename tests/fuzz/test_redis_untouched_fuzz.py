"""A refused request writes nothing to Redis, on the real path: the gateway's HTTP app and gRPC
service over the real orchestrator and session store, a real Redis, and a registered verifier
that nobody serves. An accepted request creates its session record before it fails to reach the
verifier, so the count of session keys shows both ways."""

from __future__ import annotations

import grpc
import pytest
import redis
import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from server_defaults import server_defaults
from cascade.serving.channels import ChannelPool
from cascade.serving.registry import Heartbeat
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.v1 import gateway_pb2_grpc
from gateway.grpc_api import GatewayServicer
from gateway.http_app import create_app
from gateway.sessions.orchestrator import Orchestrator, OrchestratorSettings
from gateway.server import SERVICE_NAME
from gateway.sessions.session_store import SessionStore
from gateway_requests import (
    CONTEXT,
    HTTP_SETTINGS,
    MAX_TOKENS_LIMIT,
    MODEL,
    generate_requests,
    request_bodies,
)
from harness import SLOW_EXAMPLES_SCALE, BackgroundLoop, run_fuzz

EXAMPLES_PER_SURFACE = 60
NOBODY = "127.0.0.1:1"
"""A verifier address with nothing listening: accepted sessions are created, then fail."""


def orchestrator(url: str) -> Orchestrator:
    client = aioredis.from_url(url)
    return Orchestrator(client, SessionStore(client), ChannelPool(),
                        OrchestratorSettings(max_attempts=1))


class Gateway:
    """Both front ends of a gateway whose only verifier is unreachable."""

    def __init__(self, url: str, tokenizer) -> None:
        self.redis = redis.Redis.from_url(url)
        self.redis.flushdb()
        self.background = BackgroundLoop()
        self.heartbeat = Heartbeat(aioredis.from_url(url), "verifier", NOBODY, lambda: 0)
        self.background.run(self.heartbeat.start())
        defaults = server_defaults(CONTEXT, tokenizer.eos_token_id,
                                   max_tokens_limit=MAX_TOKENS_LIMIT)
        servicer = GatewayServicer(tokenizer, orchestrator(url), MODEL, defaults)
        self.service = GrpcService([ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server,
                                                   servicer, SERVICE_NAME)], grace_s=1.0)
        self.background.run(self.service.start())
        self.channel = grpc.insecure_channel(self.service.address)
        self.generate = gateway_pb2_grpc.GatewayStub(self.channel).Generate
        self.http = TestClient(create_app(HTTP_SETTINGS, tokenizer, orchestrator(url)),
                               raise_server_exceptions=False)

    def num_sessions(self) -> int:
        return sum(1 for _ in self.redis.scan_iter("cascade:session:*"))

    def close(self) -> None:
        self.channel.close()
        self.background.run(self.heartbeat.stop())
        self.background.run(self.service.drain())
        self.background.close()
        self.redis.close()


@pytest.fixture(scope="module")
def gateway(redis_server, tokenizer):
    running = Gateway(redis_server.url, tokenizer)
    with running.http:
        yield running
    running.close()


def assert_written_only_when_accepted(gateway: Gateway, before: int, refused: bool) -> None:
    after = gateway.num_sessions()
    if refused:
        assert after == before, "a refused request wrote a session to Redis"
    else:
        assert after > before, "an accepted request created no session (the check is blind)"


def check_http(gateway: Gateway, path: str, body) -> None:
    before = gateway.num_sessions()
    response = gateway.http.post(path, content=body.raw,
                                 headers={"content-type": "application/json"})
    refused = 400 <= response.status_code < 500
    assert_written_only_when_accepted(gateway, before, refused)


def check_grpc(gateway: Gateway, fuzzed) -> None:
    before = gateway.num_sessions()
    try:
        list(gateway.generate(fuzzed.message, timeout=30))
        refused = False
    except grpc.RpcError as error:
        refused = error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_written_only_when_accepted(gateway, before, refused)


def fuzz_both(gateway: Gateway, examples: int) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        sent = run_fuzz(request_bodies(path), lambda b: check_http(gateway, path, b), examples)
        assert sent == examples
    sent = run_fuzz(generate_requests(), lambda f: check_grpc(gateway, f), examples)
    assert sent == examples


def test_refused_requests_write_nothing_to_redis(gateway):
    fuzz_both(gateway, EXAMPLES_PER_SURFACE)


@pytest.mark.slow
def test_refused_requests_write_nothing_long(gateway):
    fuzz_both(gateway, EXAMPLES_PER_SURFACE * SLOW_EXAMPLES_SCALE)
