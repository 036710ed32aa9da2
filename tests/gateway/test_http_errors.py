"""Bad requests get 4xx with a message that says what to fix; overload, failures and client
disconnects are handled."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from gateway.sessions.generation import GenerationFailed, Overloaded
from gateway.http_app import create_app

from http_fixtures import (
    MODEL,
    SETTINGS,
    OUTPUT,
    FakeGenerator,
    script,
    make_client,
    make_openai,
    stream_post,
)


LONG_PROMPT = "Hello world " * 40
BAD_REQUESTS = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 33}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": [1, "b"]}, "prompt"),
    ({"prompt": [True, 2]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a"] * 17}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt"),
    ({"prompt": ["a", "b"], "n": 9}, "n"),
    ({"prompt": LONG_PROMPT}, "prompt"),
    ({"prompt": "Hello world " * 5, "max_tokens": 32}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 3}, "stop"),
    ({"num_draft_tokens": 33}, "num_draft_tokens"),
    ({"top_k": -1}, "top_k"),
    ({"model": None}, "model"),
    # no value is coerced across types (OpenAI answers these with 400 too)
    ({"stream": "yes"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"max_tokens": "4"}, "max_tokens"),
    ({"max_tokens": 4.0}, "max_tokens"),
    ({"temperature": "0.5"}, "temperature"),
    ({"seed": "7"}, "seed"),
    ({"n": 1.0}, "n"),
    ({"num_draft_tokens": True}, "num_draft_tokens"),
    ({"draft_method": 3}, "draft_method"),
    ({"cascade_rounds": "true", "stream": True}, "cascade_rounds"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    # no 5xx for what the pods would refuse or read differently (docs/security.md)
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),  # str.isdigit accepts it, int() does not
    ({"logit_bias": {"\u0661": 1}}, "logit_bias"),
    ({"min_tokens": 2**40}, "min_tokens"),  # past the wire's uint32
    ({"min_tokens": 5}, "min_tokens"),  # more than max_tokens (4): never finished
    ({"top_p": 1e-50}, "top_p"),  # 0 as float32, as the pods get it
    ({"repetition_penalty": 1e-50}, "repetition_penalty"),  # 0: read as unset, 1
    ({"draft_min_confidence": 0.99999999}, "draft_min_confidence"),  # 1 as float32
]


@pytest.mark.parametrize(("override", "field"), BAD_REQUESTS)
async def test_bad_completion_requests(tokenizer, override, field):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, **override}
    body = {k: v for k, v in body.items() if v is not None}
    generator = FakeGenerator([[1]])
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == field
    assert field in error["message"]
    assert not generator.requests


async def test_context_length_messages_give_token_counts(tokenizer):
    async with make_client(tokenizer, FakeGenerator([[1]])) as http:
        too_long = (await http.post("/v1/completions", json={
            "model": MODEL, "prompt": LONG_PROMPT})).json()["error"]
        prompt = "Hello world " * 5
        too_much = (await http.post("/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": 32})).json()["error"]
    num_long, num_prompt = len(tokenizer(LONG_PROMPT).input_ids), len(tokenizer(prompt).input_ids)
    assert f"{num_long} tokens" in too_long["message"] and "64" in too_long["message"]
    assert too_long["code"] == "context_length_exceeded"
    assert f"{num_prompt} in the prompt, 32 for the completion" in too_much["message"]


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": LONG_PROMPT}]}, "messages"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
async def test_bad_chat_requests(tokenizer, body, field):
    async with make_client(tokenizer, FakeGenerator([[1]])) as http:
        response = await http.post("/v1/chat/completions", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]


async def test_invalid_json_and_unknown_model(tokenizer):
    async with make_client(tokenizer, FakeGenerator([[1]])) as http:
        broken = await http.post("/v1/completions", content=b'{"model": ',
                                 headers={"content-type": "application/json"})
        not_object = await http.post("/v1/completions", json=["prompt"])
        unknown = await http.post("/v1/completions", json={"model": "gpt-9", "prompt": "Hi"})
        with pytest.raises(openai.NotFoundError):
            await make_openai(http).chat.completions.create(
                model="gpt-9", messages=[{"role": "user", "content": "Hi"}])
        with pytest.raises(openai.BadRequestError):
            await make_openai(http).completions.create(model=MODEL, prompt="Hi", n=17)
    assert broken.status_code == 400 and "JSON" in broken.json()["error"]["message"]
    assert not_object.status_code == 400 and "JSON object" in not_object.json()["error"]["message"]
    assert unknown.status_code == 404
    assert unknown.json()["error"] == {"message": f"The model 'gpt-9' does not exist; this "
                                                  f"server serves '{MODEL}' (GET /v1/models "
                                                  f"lists it).",
                                       "type": "invalid_request_error", "param": "model",
                                       "code": "model_not_found"}


@pytest.mark.parametrize("stream", [False, True])
async def test_overloaded_is_503_with_retry_after(tokenizer, stream):
    generator = FakeGenerator([[1], [2]], error=Overloaded("no verifier free"), error_at=0)
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": stream})
        with pytest.raises(openai.APIStatusError) as raised:
            await make_openai(http).completions.create(model=MODEL, prompt="Hi", stream=stream)
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["message"] == "no verifier free"
    assert raised.value.status_code == 503


@pytest.mark.parametrize("stream", [False, True])
async def test_generation_failed_is_500(tokenizer, stream):
    generator = FakeGenerator([[1], [2]], error=GenerationFailed("verifier lost"), error_at=0)
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": "Hi", "stream": stream})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


async def test_error_after_stream_started_is_an_event(tokenizer):
    chunks = script(tokenizer, OUTPUT, per_chunk=4)
    generator = FakeGenerator(chunks, error=GenerationFailed("verifier lost"), error_at=2)
    async with make_client(tokenizer, generator) as http:
        _, events = await stream_post(http, "/v1/completions",
                                      {"model": MODEL, "prompt": "Hi", "stream": True})
    assert events[-1] == {"error": {"message": "verifier lost", "type": "server_error",
                                    "param": None, "code": None}}
    assert all("choices" in e for e in events[:-1]) and len(events) > 1


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_client_disconnect_closes_generation(tokenizer, spec_version):
    """A client that goes away mid-stream ends the generation (its session is released)."""
    generator = FakeGenerator([[76]] * 1000, delay=0.001)
    app = create_app(SETTINGS, tokenizer, generator)
    body = json.dumps({"model": MODEL, "prompt": "Hi", "stream": True}).encode()
    got_body, requested = asyncio.Event(), False

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await got_body.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            if got_body.is_set() and spec_version == "2.4":
                raise OSError("connection reset")
            got_body.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
             "server": ("test", 80), "client": ("client", 1234)}
    try:
        await asyncio.wait_for(app(scope, receive, send), timeout=10)
    except Exception:  # the server reports the dropped connection; only the cleanup matters
        pass
    assert generator.closed_early and not generator.completed
    assert 0 < generator.yielded < 1000


# ----- other routes -------------------------------------------------------------------------
