"""Malformed and extreme GenerateRequests against the gateway's gRPC API (a real gRPC server
with the real servicer and tokenizer): never a server fault, every INVALID_ARGUMENT names the
field as the HTTP API does, a refused request never reaches the generator (the only writer to
Redis), and a chat prompt's control tokens never become control tokens."""

from __future__ import annotations

import grpc
import pytest

from gateway_requests import (
    GRPC_FIELDS,
    Fuzzed,
    GatewayApi,
    RecordingGenerator,
    generate_requests,
)
from harness import (
    SERVER_FAULTS,
    SLOW_EXAMPLES_SCALE,
    assert_names_a_field,
    field_pattern,
    run_fuzz,
)

EXAMPLES = 300
TIMEOUT_S = 30.0
FIELDS = field_pattern(*GRPC_FIELDS, "chat")


@pytest.fixture(scope="module")
def api(tokenizer):
    running = GatewayApi(tokenizer, RecordingGenerator(tokenizer("Hello world").input_ids,
                                                          len(tokenizer)))
    yield running
    running.close()


def check_generate(api: GatewayApi, fuzzed: Fuzzed) -> None:
    asked = len(api.generator.requests)
    try:
        replies = list(api.stub.Generate(fuzzed.message, timeout=TIMEOUT_S))
    except grpc.RpcError as error:
        assert error.code() not in SERVER_FAULTS, (error.code(), error.details(), fuzzed)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
        assert fuzzed.broken, f"a valid request was refused: {error.details()} {fuzzed}"
        assert_names_a_field(error.details(), FIELDS)
        assert len(api.generator.requests) == asked, "a refused request reached the generator"
        return
    assert replies and len(api.generator.requests) == asked + 1
    if fuzzed.message.chat:  # control tokens in the text stay text
        prompt = api.generator.requests[-1].prompt_tokens
        assert api.tokenizer.eos_token_id not in prompt, fuzzed.message.prompt


def fuzz_gateway(api: GatewayApi, examples: int) -> None:
    sent = run_fuzz(generate_requests(), lambda fuzzed: check_generate(api, fuzzed), examples)
    assert sent == examples


def test_gateway_grpc_refuses_malformed_requests_by_field(api):
    fuzz_gateway(api, EXAMPLES)


@pytest.mark.slow
def test_gateway_grpc_long_fuzz(api):
    fuzz_gateway(api, EXAMPLES * SLOW_EXAMPLES_SCALE)
