"""Tool calls on the chat API (a scripted generator behind the real HTTP app, the official
openai client): tools reach the prompt, tool_choice sets the grammar, generated calls come back
as message.tool_calls (whole and streamed), and bad tool fields are refused naming them."""

from __future__ import annotations

import copy
import json

import pytest

from cascade.protocol.request.chat import chat_ids
from cascade.protocol.settings import FinishReason
from gateway.settings import HttpSettings
from gateway.openai.tools import NO_PARAMETERS, TOOLS_PROMPT, parse_tool_calls
from http_fixtures import MODEL, FakeGenerator, make_client, make_openai, script

SETTINGS = HttpSettings(model_name=MODEL, context_length=4096, max_tokens_limit=32)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("text, expected", [
    (CALL, [("get_weather", {"city": "Paris"})]),
    (f"<tool_call>{CALL}</tool_call>\n<tool_call>{{\"name\": \"get_time\", "
     f"\"arguments\": {{}}}}</tool_call>", [("get_weather", {"city": "Paris"}),
                                             ("get_time", {})]),
    ('[{"name": "get_time", "parameters": {}}]', [("get_time", {})]),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}',
     [("get_weather", {"city": "Rome"})]),
    ("It is sunny.", None),
    ('{"name": "launch_rockets", "arguments": {}}', None),
    ('{"name": "get_time", "arguments": [1]}', None),
    (f"Sure! <tool_call>{CALL}</tool_call>", None),
])
def test_parse_tool_calls(text, expected):
    calls = parse_tool_calls(text, ("get_weather", "get_time"))
    if expected is None:
        assert calls is None
        return
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == expected
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)


async def test_auto_call_comes_back_as_tool_calls(tokenizer):
    generator = FakeGenerator(script(tokenizer, CALL, eos=True), FinishReason.STOP)
    async with make_client(tokenizer, generator, SETTINGS) as http:
        result = await make_openai(http).chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME])
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert generator.request.sampling.grammar is None  # auto: free text
    time_tool = {"type": "function", "function": {"name": "get_time",
                                                  "parameters": NO_PARAMETERS}}
    system = {"role": "system", "content": TOOLS_PROMPT + json.dumps([WEATHER, time_tool])}
    assert generator.request.prompt_tokens == chat_ids(tokenizer, [system] + MESSAGES)


async def test_streamed_call_arrives_in_tool_call_deltas(tokenizer):
    generator = FakeGenerator(script(tokenizer, CALL, eos=True), FinishReason.STOP)
    async with make_client(tokenizer, generator, SETTINGS) as http:
        stream = await make_openai(http).chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=[WEATHER], stream=True)
        chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.content for d in deltas)
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == "" and calls[0].index == 0
    arguments = "".join(t.function.arguments or "" for t in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_auto_text_stays_content_and_none_renders_no_tools(tokenizer):
    for choice, expected_prompt in (("auto", None), ("none", chat_ids(tokenizer, MESSAGES))):
        generator = FakeGenerator(script(tokenizer, "It is sunny.", eos=True), FinishReason.STOP)
        async with make_client(tokenizer, generator, SETTINGS) as http:
            result = await make_openai(http).chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice=choice)
        assert result.choices[0].message.content == "It is sunny."
        assert result.choices[0].finish_reason == "stop"
        if expected_prompt is not None:
            assert generator.request.prompt_tokens == expected_prompt


async def test_required_and_named_choices_constrain_the_output(tokenizer):
    named = {"type": "function", "function": {"name": "get_weather"}}
    grammars = {}
    for key, choice, parallel in (("required", "required", True),
                                  ("single", "required", False), ("named", named, True)):
        generator = FakeGenerator(script(tokenizer, f"[{CALL}]", eos=True), FinishReason.STOP)
        async with make_client(tokenizer, generator, SETTINGS) as http:
            result = await make_openai(http).chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=[WEATHER, TIME], tool_choice=choice,
                parallel_tool_calls=parallel)
        assert result.choices[0].message.tool_calls[0].function.name == "get_weather"
        grammars[key] = json.loads(generator.request.sampling.grammar.spec)
    call_schema = grammars["named"]
    assert call_schema["properties"] == {"name": {"const": "get_weather"},
                                         "arguments": WEATHER["function"]["parameters"]}
    assert grammars["required"]["minItems"] == 1 and "maxItems" not in grammars["required"]
    assert grammars["single"]["maxItems"] == 1
    assert call_schema in grammars["required"]["items"]["anyOf"]


async def test_a_template_that_renders_tools_gets_them(tokenizer):
    with_tools = copy.deepcopy(tokenizer)
    with_tools.chat_template = ("{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
                                + tokenizer.chat_template)
    generator = FakeGenerator(script(tokenizer, CALL, eos=True), FinishReason.STOP)
    async with make_client(with_tools, generator, SETTINGS) as http:
        await make_openai(http).chat.completions.create(model=MODEL, messages=MESSAGES,
                                                        tools=[WEATHER])
    assert generator.request.prompt_tokens == chat_ids(with_tools, MESSAGES, [WEATHER])
    assert "<|tools|>" in with_tools.decode(generator.request.prompt_tokens)


async def test_history_with_calls_and_bad_tool_fields(tokenizer):
    history = MESSAGES + [
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    generator = FakeGenerator(script(tokenizer, "Sunny.", eos=True), FinishReason.STOP)
    async with make_client(tokenizer, generator, SETTINGS) as http:
        ok = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": history, "tools": [WEATHER]})
        assert ok.status_code == 200, ok.text
        assert '"city": "Paris"' in tokenizer.decode(generator.request.prompt_tokens)
        for body, param in (
                ({"tool_choice": "required"}, "tool_choice"),
                ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                      "function": {"name": "nope"}}},
                 "tool_choice"),
                ({"tools": [WEATHER], "tool_choice": "required",
                  "response_format": {"type": "json_object"}}, "tool_choice"),
                ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
                 "tools[0].function.name"),
                ({"tools": [{"type": "retrieval"}]}, "tools[0].type")):
            response = await http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": MESSAGES, **body})
            assert response.status_code == 400, (body, response.text)
            assert response.json()["error"]["param"] == param


async def test_calls_whose_structured_output_is_too_large_are_refused_naming_tools(tokenizer):
    """tool_choice "required" constrains the output to the tools' schemas: past the grammar's
    64 KB limit that is a 400 naming tools, as the same schema in response_format is (it was a
    500)."""
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 90}
                                             for i in range(800)}}
    big = {"type": "function", "function": {"name": "big", "parameters": wide}}
    settings = HttpSettings(model_name=MODEL, context_length=200_000, max_tokens_limit=32)
    async with make_client(tokenizer, FakeGenerator([[1]]), settings) as http:
        for body, param in (
                ({"tools": [big], "tool_choice": "required"}, "tools"),
                ({"response_format": {"type": "json_schema", "json_schema": {
                    "name": "big", "schema": wide}}}, "response_format.json_schema.schema")):
            response = await http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": MESSAGES, "max_tokens": 4, **body})
            assert response.status_code == 400, (param, response.text[:300])
            error = response.json()["error"]
            assert error["param"] == param and "65536" in error["message"], error
