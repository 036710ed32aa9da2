"""Structured-output fields map to one grammar in the session's settings (HTTP and gRPC alike),
and malformed or conflicting ones are refused naming the field (400 / INVALID_ARGUMENT)."""

from __future__ import annotations

import json

import grpc
import pytest

from cascade.protocol.grammar import Grammar
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from gateway.grpc_api import GatewayServicer
from http_fixtures import MODEL, SETTINGS, FakeGenerator, make_client, script

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}

MAPPED = [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, Grammar("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "thing", "schema": SCHEMA, "strict": True}}}, Grammar.json_schema(SCHEMA)),
    ({"structured_outputs": {"json": SCHEMA}}, Grammar.json_schema(SCHEMA)),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, Grammar.json_schema(SCHEMA)),
    ({"structured_outputs": {"json_object": True}}, Grammar("json_object")),
    ({"structured_outputs": {"regex": "[ab]+"}}, Grammar("regex", "[ab]+")),
    ({"structured_outputs": {"grammar": 'start: "x"'}}, Grammar("lark", 'start: "x"')),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, Grammar.choice(["yes", "no"])),
    ({"guided_json": SCHEMA}, Grammar.json_schema(SCHEMA)),
    ({"guided_regex": "[ab]+"}, Grammar("regex", "[ab]+")),
    ({"guided_grammar": 'start: "x"'}, Grammar("lark", 'start: "x"')),
    ({"guided_choice": ["yes", "no"]}, Grammar.choice(["yes", "no"])),
]

REFUSED = [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "frobnicate"}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs.regexp"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_regex": "a", "acceptance": "cascade"}, "acceptance"),
    ({"guided_regex": "a", "min_tokens": 2}, "min_tokens"),
    ({"guided_regex": "a", "bad_words": ["a"]}, "bad_words"),
]


@pytest.mark.parametrize("fields, grammar", MAPPED)
async def test_fields_map_to_one_grammar(tokenizer, fields, grammar):
    for path, body in (("/v1/chat/completions", CHAT),
                       ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 5})):
        generator = FakeGenerator(script(tokenizer, "ok"))
        async with make_client(tokenizer, generator) as http:
            response = await http.post(path, json={**body, **fields})
        assert response.status_code == 200, response.text
        assert generator.request.sampling.grammar == grammar


@pytest.mark.parametrize("fields, param", REFUSED)
async def test_bad_fields_are_refused_naming_them(tokenizer, fields, param):
    generator = FakeGenerator(script(tokenizer, "ok"))
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/chat/completions", json={**CHAT, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert generator.requests == []


@pytest.fixture
async def grpc_stub(tokenizer):
    generator = FakeGenerator(script(tokenizer, "ok"))
    servicer = GatewayServicer(tokenizer, generator, MODEL,
                               SETTINGS.server_defaults(tokenizer.eos_token_id))
    service = GrpcService([ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server,
                                          servicer, "cascade.v1.Gateway")])
    port = await service.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield gateway_pb2_grpc.GatewayStub(channel), generator
    await service.drain()


@pytest.mark.parametrize("grammar, problem", [
    (common_pb2.Grammar(kind="json_schema", spec=json.dumps(SCHEMA)), None),
    (common_pb2.Grammar(kind="regex", spec="(yes|no)"), None),
    (common_pb2.Grammar(kind="json_schema", spec="{"), "valid JSON"),
    (common_pb2.Grammar(kind="toml", spec=""), "kind"),
])
async def test_grpc_structured_output(grpc_stub, grammar, problem):
    stub, generator = grpc_stub
    request = gateway_pb2.GenerateRequest(prompt="Hi", max_tokens=3, structured_output=grammar)
    if problem is None:
        [r async for r in stub.Generate(request, timeout=30)]
        assert generator.request.sampling.grammar == Grammar(grammar.kind, grammar.spec)
        return
    with pytest.raises(grpc.aio.AioRpcError) as error:
        [r async for r in stub.Generate(request, timeout=30)]
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "structured_output" in error.value.details() and problem in error.value.details()


async def test_every_choice_gets_the_grammar(tokenizer):
    generator = FakeGenerator(script(tokenizer, "ok"))
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": ["Hi", "Ho"], "n": 2, "max_tokens": 3,
            "guided_regex": "[ab]+"})
    assert response.status_code == 200, response.text
    assert len(generator.requests) == 4
    assert {r.sampling.grammar for r in generator.requests} == {Grammar("regex", "[ab]+")}
