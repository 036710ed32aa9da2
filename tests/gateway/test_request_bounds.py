"""What one request may make the gateway hold and store is bounded: stop strings and bad words
(count and length, checked before anything is tokenized), a gRPC message (as an HTTP body), the
text an error quotes back; and mapping a request runs off the event loop, so a slow one holds up
no other stream."""

from __future__ import annotations

import asyncio
import threading

import grpc
import httpx
import pytest

from cascade.protocol.request.options import MAX_BAD_WORD_CHARS, MAX_STOP_CHARS, validate_options
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.completions import CompletionsApi
from http_fixtures import MODEL, FakeGenerator, make_client, script

PROMPT = "Hello world " * 6
LONGEST_ERROR = 400
"""An error message's length whatever the client sent (it quotes at most a short part)."""


TOO_MUCH = [
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ["a" * (MAX_STOP_CHARS + 1)]}, "stop"),
    ({"stop": ["\U0001F600" * (MAX_STOP_CHARS + 1), "b"]}, "stop"),  # characters, not bytes
    ({"stop": ["x" * 200_000] * 4}, "stop"),
    ({"bad_words": ["w" * (MAX_BAD_WORD_CHARS + 1)]}, "bad_words"),
    ({"bad_words": ["ok", "w" * 500_000]}, "bad_words"),
]


@pytest.mark.parametrize(("fields", "param"), TOO_MUCH)
async def test_long_or_many_stop_strings_and_bad_words_are_refused_by_both_apis(
        both, fields, param):
    http, stub, http_generator, grpc_generator = both
    response = await http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                         "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text[:200]
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]
    assert len(error["message"]) < LONGEST_ERROR  # the value is not quoted back whole
    with pytest.raises(grpc.aio.AioRpcError) as info:
        request = gateway_pb2.GenerateRequest(model=MODEL, prompt=PROMPT, max_tokens=4, **fields)
        [r async for r in stub.Generate(request, timeout=10)]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == error["message"]
    assert not http_generator.requests and not grpc_generator.requests


async def test_stop_strings_and_bad_words_at_the_limit_are_taken(both):
    http, _, generator, _ = both
    stops = ["\U0001F600" * MAX_STOP_CHARS, "a" * MAX_STOP_CHARS, "b", "c"]
    response = await http.post("/v1/completions", json={
        "model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stop": stops,
        "bad_words": ["world"]})
    assert response.status_code == 200, response.text[:300]
    assert generator.request.sampling.bad_words
    # a word as long as allowed is tokenized (this tokenizer makes more than 16 tokens of it)
    assert validate_options({"bad_words": ["w" * MAX_BAD_WORD_CHARS]}).bad_words


@pytest.mark.parametrize(("fields", "quoted"), [
    ({"model": "m" * 100_000}, "m" * 64 + "..."),
    ({"draft_method": "d" * 100_000}, "d" * 64 + "..."),
    ({"guided_regex": "(" + "a" * 20_000}, "aaa..."),  # the compiler quotes the grammar
    ({"logit_bias": {"x" * 100_000: 1}}, "x" * 64 + "..."),
])
async def test_errors_quote_a_long_value_cut_short(tokenizer, fields, quoted):
    async with make_client(tokenizer, FakeGenerator([[1]])) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi",
                                                            **fields})
    message = response.json()["error"]["message"]
    assert response.status_code in (400, 404) and quoted in message
    assert len(message) < LONGEST_ERROR


def test_a_bad_word_too_many_tokens_long_is_quoted_cut_short(tokenizer):
    from cascade.protocol.limits import RequestInvalid
    from cascade.protocol.request.mapping import build_request, with_bad_words
    from server_defaults import server_defaults
    from cascade.protocol.request.options import validate_options

    word = "ab " * 80  # within the character limit, over the token limit
    options = validate_options({"bad_words": [word]})
    request = build_request(options, [1, 2], 4, server_defaults(64))
    with pytest.raises(RequestInvalid, match="longer than 16 tokens") as info:
        with_bad_words(request, options, lambda text: tokenizer(text).input_ids)
    assert info.value.param == "bad_words" and len(str(info.value)) < 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_mapping_a_request_does_not_hold_up_the_event_loop(tokenizer, monkeypatch, path):
    """A mapping that takes a while (here: tokenizing a bad word waits for /health to answer)
    runs in a worker thread: /health, and every stream, go on meanwhile. On the event loop it
    would hold /health up until it ended (the wait times out: the request maps nothing)."""
    mapping, health_answered = threading.Event(), threading.Event()
    waited: list[bool] = []
    word_ids = CompletionsApi._word_ids

    def slow_word_ids(self, text: str) -> list[int]:
        mapping.set()
        waited.append(health_answered.wait(timeout=5.0))
        return word_ids(self, text)

    monkeypatch.setattr(CompletionsApi, "_word_ids", slow_word_ids)
    generator = FakeGenerator(script(tokenizer, "ok"))
    body = {"model": MODEL, "max_tokens": 4, "bad_words": ["world"]}
    body |= ({"prompt": "Hi"} if path == "/v1/completions"
             else {"messages": [{"role": "user", "content": "Hi"}]})
    async with make_client(tokenizer, generator) as http:
        async def health():
            while not mapping.is_set():  # once the mapping has begun
                await asyncio.sleep(0.01)
            response = await http.get("/health")
            health_answered.set()
            return response

        mapped, checked = await asyncio.gather(http.post(path, json=body), health())
    assert mapped.status_code == 200 and checked.status_code == 200
    assert waited and all(waited)  # /health answered while the mapping ran


async def test_a_grpc_message_over_the_body_limit_is_refused_before_it_is_parsed(tmp_path):
    """The gateway's gRPC port takes what its HTTP API takes (--max-body-bytes), not 16 MiB:
    fields the prompt check does not see count too."""
    from cascade.tools.redis_server import free_port
    from cascade.tools.tiny_models import build_tiny_pair
    from gateway.server import build_gateway
    from cascade.serving.mesh.security import MeshSettings
    from gateway.settings import GatewaySettings
    from gateway.sessions.session_store import connect

    target, _ = build_tiny_pair(tmp_path / "models")
    url = f"redis://127.0.0.1:{free_port()}/0"  # refused before Redis is needed
    client = connect(url, timeout_s=0.2, retries=1)
    limit = 4096
    settings = GatewaySettings(model=str(target), mesh=MeshSettings(redis_url=url), grpc_port=0,
                               max_body_bytes=limit)
    app, service = build_gateway(settings, client)
    await service.start()
    try:
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(prompt="def main():" * 100,  # 1,100 bytes
                                                  stop=["s" * 500] * 4, max_tokens=4,
                                                  bad_words=["w" * 200] * 8)
            assert limit < request.ByteSize() and len(request.prompt) < limit
            with pytest.raises(grpc.aio.AioRpcError) as info:
                [r async for r in stub.Generate(request, timeout=10)]
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gateway") as http:  # the same, as HTTP
            response = await http.post("/v1/completions", content=b"{" + b" " * limit + b"}",
                                       headers={"content-type": "application/json"})
        assert response.status_code == 413
    finally:
        await service.drain()
        await client.aclose()
