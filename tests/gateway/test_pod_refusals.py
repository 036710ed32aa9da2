"""A pod that refuses a session's settings (INVALID_ARGUMENT) is a caller mistake, not a server
fault: the client hears 400 over HTTP (whole or streamed) and INVALID_ARGUMENT over the gateway's
gRPC API, with the pod's message, and nothing is retried. The real path: the HTTP app and the
gRPC service over the real orchestrator, a real Redis, and a verifier on loopback that refuses
every session."""

from __future__ import annotations

import grpc
import pytest
import redis.asyncio as aioredis

from server_defaults import server_defaults
from cascade.serving.channels import ChannelPool
from cascade.serving.registry import Heartbeat
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2_grpc
from gateway.grpc_api import GatewayServicer
from gateway.sessions.orchestrator import Orchestrator, OrchestratorSettings
from gateway.server import SERVICE_NAME
from gateway.sessions.session_store import SessionStore
from http_fixtures import MODEL, SETTINGS, make_client

REFUSAL = "sampling.top_p: must be in (0, 1], got 0"


class RefusingVerifier(verifier_pb2_grpc.VerifierServicer):
    """Refuses every session, as a verifier refuses settings it cannot run."""

    def __init__(self) -> None:
        self.calls = 0

    async def Decode(self, request, context):
        self.calls += 1
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, REFUSAL)
        yield  # a stream of rounds, never reached


@pytest.fixture
async def gateway(redis_client, redis_server, tokenizer):
    """(orchestrator, the refusing verifier) with the verifier registered."""
    verifier = RefusingVerifier()
    service = GrpcService([ServiceBinding(verifier_pb2_grpc.add_VerifierServicer_to_server,
                                          verifier, "cascade.v1.Verifier")])
    await service.start()
    heartbeat = Heartbeat(aioredis.from_url(redis_server.url), "verifier", service.address,
                          lambda: 0)
    await heartbeat.start()
    orchestrator = Orchestrator(redis_client, SessionStore(redis_client), ChannelPool(),
                                OrchestratorSettings(max_attempts=3))
    yield orchestrator, verifier
    await heartbeat.stop()
    await service.drain()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_pods_refusal_reaches_an_http_client_as_400(gateway, tokenizer, stream):
    orchestrator, verifier = gateway
    async with make_client(tokenizer, orchestrator) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": "Hello", "max_tokens": 4, "num_draft_tokens": 0,
            "stream": stream})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and REFUSAL in error["message"]
    assert verifier.calls == 1  # not retried: the same settings would be refused again


async def test_a_pods_refusal_reaches_a_grpc_client_as_invalid_argument(gateway, tokenizer):
    orchestrator, verifier = gateway
    defaults = server_defaults(SETTINGS.context_length, tokenizer.eos_token_id,
                               max_tokens_limit=SETTINGS.max_tokens_limit)
    servicer = GatewayServicer(tokenizer, orchestrator, MODEL, defaults)
    service = GrpcService([ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server,
                                          servicer, SERVICE_NAME)])
    await service.start()
    try:
        async with grpc.aio.insecure_channel(service.address) as channel:
            call = gateway_pb2_grpc.GatewayStub(channel).Generate(gateway_pb2.GenerateRequest(
                model=MODEL, prompt="Hello", max_tokens=4, num_draft_tokens=0), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [reply async for reply in call]
    finally:
        await service.drain()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert REFUSAL in refused.value.details() and verifier.calls == 1
