"""Structured outputs through the whole cluster (real Redis, verifier, drafter and gateway,
the official openai client): greedy text equals the target's greedy decoding under the same
grammar mask, token for token, with the target alone, speculative chains and token trees; every
finished JSON output validates against its schema; bad grammars are refused on both APIs."""

import json

import grpc
import jsonschema
import openai
import pytest

from cascade.protocol.request.chat import chat_ids
from cascade.protocol.grammar import Grammar
from cascade.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from grammar_reference import SCHEMAS, masked_greedy

MAX_TOKENS = 48
DRAFTS = [{"num_draft_tokens": 0}, {"num_draft_tokens": 4},
          {"num_draft_tokens": 4, "draft_tree_nodes": 8}]
DRAFT_IDS = ["target-alone", "chains", "trees"]
MESSAGES = [{"role": "user", "content": "Describe a thing as JSON."}]


def client(cluster) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused")


@pytest.mark.parametrize("draft", DRAFTS, ids=DRAFT_IDS)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_chat_json_schema_is_the_targets_masked_greedy(cluster, name, draft):
    tokenizer = cluster.target.tokenizer
    reference = masked_greedy(cluster.target, chat_ids(tokenizer, MESSAGES),
                              Grammar.json_schema(SCHEMAS[name]), MAX_TOKENS)
    result = await client(cluster).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}},
        extra_body={"draft_schedule": "fixed", **draft})
    choice = result.choices[0]
    assert reference[-1] == tokenizer.eos_token_id and choice.finish_reason == "stop"
    assert choice.message.content == tokenizer.decode(reference[:-1])
    assert result.usage.completion_tokens == len(reference)
    jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


@pytest.mark.parametrize("draft", DRAFTS, ids=DRAFT_IDS)
async def test_streamed_completion_regex(cluster, draft):
    tokenizer = cluster.target.tokenizer
    regex = r"(yes|no), [0-9]{1,3}"
    prompt = "def main():"
    reference = masked_greedy(cluster.target, tokenizer(prompt).input_ids,
                              Grammar("regex", regex), MAX_TOKENS)
    stream = await client(cluster).completions.create(
        model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        extra_body={"structured_outputs": {"regex": regex}, "draft_schedule": "fixed",
                    **draft})
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == tokenizer.decode(reference[:-1])
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert text.split(", ")[0] in ("yes", "no") and text.split(", ")[1].isdigit()


async def test_sampled_json_objects_always_validate(cluster):
    """Sampled (temperature 1, speculative) outputs of several seeds: each finished one
    parses and validates."""
    api = client(cluster)
    finished = 0
    for seed in range(4):
        result = await api.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0,
            seed=seed, extra_body={"guided_json": SCHEMAS["nested"], "num_draft_tokens": 3})
        choice = result.choices[0]
        if choice.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(choice.message.content), SCHEMAS["nested"])
    assert finished >= 3


async def test_bad_grammars_are_refused_on_both_apis(cluster):
    with pytest.raises(openai.BadRequestError) as error:
        await client(cluster).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "nope"}}})
    assert error.value.body["param"] == "response_format.json_schema.schema"
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(
            prompt="x", max_tokens=4,
            structured_output=common_pb2.Grammar(kind="regex", spec="(unclosed"))
        with pytest.raises(grpc.aio.AioRpcError) as rpc_error:
            [r async for r in stub.Generate(request, timeout=60)]
    assert rpc_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "structured_output" in rpc_error.value.details()


async def test_grpc_choice_is_the_targets_masked_greedy(cluster):
    tokenizer = cluster.target.tokenizer
    grammar = Grammar.choice(["red", "green", "blue"])
    reference = masked_grammar_text(cluster, "x = ", grammar)
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(
            prompt="x = ", max_tokens=16, temperature=0, num_draft_tokens=4,
            structured_output=common_pb2.Grammar(kind=grammar.kind, spec=grammar.spec))
        responses = [r async for r in stub.Generate(request, timeout=60)]
    assert "".join(r.text for r in responses) == reference
    assert responses[-1].finish_reason == common_pb2.FINISH_REASON_STOP
    assert tokenizer.decode([t for r in responses for t in r.token_ids][:-1]) == reference


def masked_grammar_text(cluster, prompt: str, grammar: Grammar) -> str:
    tokenizer = cluster.target.tokenizer
    ids = masked_greedy(cluster.target, tokenizer(prompt).input_ids, grammar, 16)
    assert ids[-1] == tokenizer.eos_token_id
    return tokenizer.decode(ids[:-1])


WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {
        "unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["unit", "days"], "additionalProperties": False}}}


@pytest.mark.parametrize("draft", DRAFTS, ids=DRAFT_IDS)
async def test_named_tool_call_is_the_targets_masked_greedy(cluster, draft):
    """A named tool choice through the real cluster: the call's text is the target's greedy
    decoding under the call's schema, and it comes back as a tool call whose arguments
    validate against the function's parameters."""
    from gateway.openai.tools import ToolFields, with_tools

    tokenizer = cluster.target.tokenizer
    choice = {"type": "function", "function": {"name": "get_weather"}}
    fields = ToolFields(tools=[WEATHER], tool_choice=choice)
    messages = with_tools(MESSAGES, fields.template_tools(), tokenizer.chat_template)
    reference = masked_greedy(cluster.target, chat_ids(tokenizer, messages),
                              fields.tool_grammar(), MAX_TOKENS)
    result = await client(cluster).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
        tools=[WEATHER], tool_choice=choice, extra_body={"draft_schedule": "fixed", **draft})
    message = result.choices[0].message
    assert result.choices[0].finish_reason == "tool_calls" and message.content is None
    [call] = message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert json.loads(tokenizer.decode(reference[:-1]))["arguments"] == arguments
    assert result.usage.completion_tokens == len(reference)


async def test_required_tool_call_streams_as_tool_call_deltas(cluster):
    stream = await client(cluster).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        extra_body={"num_draft_tokens": 4})
    chunks = [chunk async for chunk in stream]
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    arguments = json.loads("".join(t.function.arguments or "" for t in calls))
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("draft", DRAFTS[:2] + [{"num_draft_tokens": 4, "draft_schedule": "auto"}],
                         ids=DRAFT_IDS[:2] + ["auto"])
async def test_forced_positions_are_filled_and_counted(cluster, draft):
    """A JSON schema with fixed keys: the verifier fills the positions the grammar forces after
    its own token, without a pass (jump-forward). The rounds of the stream mark those tokens
    ``filled`` and count forced ones, and the text is still the target's masked greedy."""
    tokenizer = cluster.target.tokenizer
    reference = masked_greedy(cluster.target, chat_ids(tokenizer, MESSAGES),
                              Grammar.json_schema(SCHEMAS["flat"]), MAX_TOKENS)
    stream = await client(cluster).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "flat", "schema": SCHEMAS["flat"]}},
        extra_body={"cascade_rounds": True, "draft_schedule": "fixed", **draft})
    chunks = [chunk async for chunk in stream]
    rounds = [c.model_extra["cascade"] for c in chunks if (c.model_extra or {}).get("cascade")]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tokenizer.decode(reference[:-1])
    kinds = [t["kind"] for r in rounds for t in r["tokens"]]
    assert len(kinds) == len(reference)
    assert sum(r["num_filled"] for r in rounds) == kinds.count("filled") > 0
    assert sum(r["num_forced"] for r in rounds) >= kinds.count("filled")
    assert len(rounds) < len(reference) - kinds.count("filled") + 1
