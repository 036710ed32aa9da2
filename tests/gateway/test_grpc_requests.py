"""The gateway's gRPC Generate turns requests into generation requests through the one mapping
(cascade.protocol.request.mapping), with the same length rules as the HTTP layer, and refuses what does
not fit with a message that says why."""

import pytest

from cascade.protocol.limits import RequestInvalid, fit_lengths
from server_defaults import server_defaults
from cascade.v1 import gateway_pb2
from gateway.grpc_api import GatewayServicer

CONTEXT = 64


@pytest.fixture
def servicer(tokenizer):
    defaults = server_defaults(CONTEXT, tokenizer.eos_token_id, max_tokens_limit=CONTEXT,
                               num_draft_tokens=4)
    return GatewayServicer(tokenizer, generator=None, model_name="m", server=defaults)


def request(prompt: str, max_tokens: int | None = None, **fields) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, **fields)


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
    generation, stops = servicer._request(request("hello world", max_tokens=5,
                                                  num_draft_tokens=2, stop=["x"]))
    assert generation.prompt_tokens == tokenizer("hello world").input_ids
    assert generation.sampling.max_new_tokens == 5 and generation.num_draft_tokens == 2
    assert stops == ["x"]
    unset, _ = servicer._request(request("hello world"))
    assert unset.sampling.max_new_tokens == CONTEXT - len(generation.prompt_tokens)
    assert unset.sampling.temperature == 1.0 and unset.num_draft_tokens == 4


def test_grpc_seed_zero_is_a_seed_and_unset_is_random(servicer):
    zero = [servicer._request(request("hi", 4, seed=0))[0].sampling.seed for _ in range(2)]
    assert zero == [0, 0]
    unset = {servicer._request(request("hi", 4))[0].sampling.seed for _ in range(3)}
    assert len(unset) == 3


@pytest.mark.parametrize(("prompt", "max_tokens", "message"), [
    ("", 5, "must not be empty"),
    ("hello " * 80, 5, "maximum context length is 64"),
    ("hello world", 60, "via 'max_tokens'"),
    ("hello world", 65, "must be in \\[1, 64\\]"),
])
def test_grpc_bad_lengths_are_invalid_arguments(servicer, prompt, max_tokens, message):
    with pytest.raises(ValueError, match=message):  # the error interceptor: INVALID_ARGUMENT
        servicer._request(request(prompt, max_tokens))


def test_grpc_refuses_an_unknown_model_too_many_drafts_and_an_unknown_method(servicer):
    with pytest.raises(ValueError, match="does not exist"):
        servicer._request(request("hi", 4, model="other"))
    with pytest.raises(ValueError, match="num_draft_tokens.*32"):
        servicer._request(request("hi", 4, num_draft_tokens=99))
    with pytest.raises(ValueError, match="draft_method.*ngram") as info:
        servicer._request(request("hi", 4, draft_method="telepathy"))
    assert info.value.param == "draft_method"


def test_a_grpc_prompt_over_the_size_limit_is_refused_before_tokenizing(tokenizer):
    defaults = server_defaults(CONTEXT, tokenizer.eos_token_id, max_tokens_limit=CONTEXT,
                               num_draft_tokens=4)
    small = GatewayServicer(tokenizer, None, "m", defaults, max_prompt_bytes=100)
    with pytest.raises(RequestInvalid, match="longer than 100 bytes") as info:
        small._request(request("x" * 101))
    assert info.value.param == "prompt" and info.value.code == "request_too_large"


async def test_a_grpc_key_runs_at_most_its_limit_of_sessions(tokenizer):
    import grpc

    from cascade.serving.server import GrpcService, ServiceBinding
    from cascade.v1 import gateway_pb2_grpc
    from gateway.limits import KeyLimits
    from http_fixtures import FakeGenerator, script

    defaults = server_defaults(CONTEXT, tokenizer.eos_token_id, max_tokens_limit=CONTEXT,
                               num_draft_tokens=4)
    generator = FakeGenerator(script(tokenizer, "Hello world again"), delay=0.3)
    servicer = GatewayServicer(tokenizer, generator, "m", defaults, limits=KeyLimits(1))
    service = GrpcService([ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server,
                                          servicer, "cascade.v1.Gateway")])
    await service.start()
    try:
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            first = stub.Generate(request("hello", max_tokens=8))
            await first.read()  # the first session runs
            second = stub.Generate(request("hello", max_tokens=8))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await second.read()
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "concurrent sessions" in caught.value.details()
            while (more := await first.read()) is not grpc.aio.EOF:  # it finishes normally
                last = more
            assert last.finish_reason
            third = [r async for r in stub.Generate(request("hello", max_tokens=8))]
            assert third[-1].finish_reason
    finally:
        await service.drain()
