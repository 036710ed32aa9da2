"""A tiny real tokenizer for the gateway tests, and the HTTP and gRPC APIs side by side."""

import grpc
import pytest

from cascade.serving.server import GrpcService, ServiceBinding
from cascade.v1 import gateway_pb2_grpc
from gateway.grpc_api import GatewayServicer
from http_fixtures import MODEL, SETTINGS, FakeGenerator, make_client, script
from tokenizers_fixture import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
async def both(tokenizer):
    """(HTTP client, gRPC stub, their generators) over the same tokenizer and limits."""
    http_generator, grpc_generator = (FakeGenerator(script(tokenizer, "ok")) for _ in range(2))
    servicer = GatewayServicer(tokenizer, grpc_generator, MODEL,
                               SETTINGS.server_defaults(tokenizer.eos_token_id))
    service = GrpcService([ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server,
                                          servicer, "cascade.v1.Gateway")])
    port = await service.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    async with make_client(tokenizer, http_generator) as http:
        yield http, gateway_pb2_grpc.GatewayStub(channel), http_generator, grpc_generator
    await channel.close()
    await service.drain()
