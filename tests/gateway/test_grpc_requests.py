"""The gateway's gRPC Generate turns requests into generation requests with the same length rules
as the HTTP layer (gateway.limits), and refuses what does not fit with a message that says why."""

import pytest

from cascade.v1 import gateway_pb2
from gateway.grpc_api import GatewayServicer
from gateway.limits import RequestInvalid, fit_lengths

CONTEXT = 64


@pytest.fixture
def servicer(tokenizer):
    return GatewayServicer(tokenizer, generator=None, model_name="m", context_length=CONTEXT,
                           default_num_draft_tokens=4)


def request(prompt: str, max_new_tokens: int = 0, **fields) -> gateway_pb2.GenerateRequest:
    msg = gateway_pb2.GenerateRequest(prompt=prompt, **fields)
    msg.sampling.max_new_tokens = max_new_tokens
    return msg


def test_fit_lengths_defaults_and_limits():
    assert fit_lengths(10, None, context=64, limit=32) == 32
    assert fit_lengths(50, None, context=64, limit=32) == 14
    assert fit_lengths(10, 5, context=64, limit=32) == 5
    with pytest.raises(RequestInvalid, match="must be in \\[1, 32\\]") as info:
        fit_lengths(10, 33, context=64, limit=32)
    assert info.value.param == "max_tokens"
    with pytest.raises(RequestInvalid, match="alone is 64 tokens") as info:
        fit_lengths(64, None, context=64, limit=32)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(RequestInvalid, match="requested 70 tokens"):
        fit_lengths(40, 30, context=64, limit=32)


def test_grpc_request_uses_the_shared_rules(servicer, tokenizer):
    generation = servicer._request(request("hello world", max_new_tokens=5, num_draft_tokens=2))
    assert generation.prompt_tokens == tokenizer("hello world").input_ids
    assert generation.sampling.max_new_tokens == 5 and generation.num_draft_tokens == 2
    unset = servicer._request(request("hello world"))
    assert unset.sampling.max_new_tokens == CONTEXT - len(generation.prompt_tokens)


@pytest.mark.parametrize(("prompt", "max_new_tokens", "message"), [
    ("", 5, "must not be empty"),
    ("hello " * 80, 5, "maximum context length is 64"),
    ("hello world", 60, "via 'sampling.max_new_tokens'"),
    ("hello world", 65, "must be in \\[1, 64\\]"),
])
def test_grpc_bad_lengths_are_invalid_arguments(servicer, prompt, max_new_tokens, message):
    with pytest.raises(ValueError, match=message):  # the error interceptor: INVALID_ARGUMENT
        servicer._request(request(prompt, max_new_tokens))


def test_grpc_refuses_an_unknown_model_and_too_many_drafts(servicer):
    with pytest.raises(ValueError, match="not served"):
        servicer._request(request("hi", 4, model="other"))
    with pytest.raises(ValueError, match="num_draft_tokens must be in"):
        servicer._request(request("hi", 4, num_draft_tokens=99))
