"""The OpenAI-compatible HTTP layer against a scripted generator and a tiny real tokenizer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry, Counter

from cascade.types import FinishReason
from gateway.detokenize import IncrementalDetokenizer, StopStringMatcher
from gateway.generation import GeneratedChunk, GenerationFailed, GenerationRequest, Overloaded
from gateway.http_app import HttpSettings, create_app
from tokenizers_fixture import build_tokenizer

MODEL = "tiny-model"
SETTINGS = HttpSettings(model_name=MODEL, context_length=64, max_tokens_limit=32)
OUTPUT = "Hello world, naïve café 日本語 and the quick brown fox."


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


class FakeGenerator:
    """Yields scripted token chunks, records requests, and notes whether it was closed early."""

    def __init__(self, chunks: list[list[int]], finish: FinishReason = FinishReason.LENGTH,
                 error: Exception | None = None, error_at: int = 0, delay: float = 0.0) -> None:
        self.chunks, self.finish, self.delay = chunks, finish, delay
        self.error, self.error_at = error, error_at
        self.requests: list[GenerationRequest] = []
        self.yielded = 0
        self.closed_early = False
        self.completed = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GeneratedChunk]:
        self.requests.append(request)
        try:
            for i, ids in enumerate(self.chunks):
                if self.error is not None and i == self.error_at:
                    raise self.error
                last = i == len(self.chunks) - 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                self.yielded += 1
                yield GeneratedChunk("s-1", ids, num_accepted=len(ids) - 1, num_drafted=3,
                                     finish_reason=self.finish if last else None)
            self.completed = True
        except (GeneratorExit, asyncio.CancelledError):
            self.closed_early = True
            raise

    @property
    def request(self) -> GenerationRequest:
        assert len(self.requests) == 1
        return self.requests[0]


def script(tokenizer, text: str, per_chunk: int = 3, eos: bool = False) -> list[list[int]]:
    ids = tokenizer(text).input_ids + ([tokenizer.eos_token_id] if eos else [])
    return [ids[i:i + per_chunk] for i in range(0, len(ids), per_chunk)]


def make_client(tokenizer, generator, **app_kwargs) -> httpx.AsyncClient:
    app = create_app(SETTINGS, tokenizer, generator, **app_kwargs)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def make_openai(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http,
                              max_retries=0)


def parse_sse(body: str) -> list[str]:
    """The data of each event, asserting OpenAI's exact framing (only data lines, [DONE] last)."""
    assert body.endswith("data: [DONE]\n\n"), body[-80:]
    events = body.split("\n\n")
    assert events[-1] == ""
    datas = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, repr(event)
        datas.append(event[len("data: "):])
    assert datas[-1] == "[DONE]" and "[DONE]" not in datas[:-1]
    return datas[:-1]


async def stream_post(
    http: httpx.AsyncClient, path: str, body: dict
) -> tuple[httpx.Response, list[dict]]:
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, [json.loads(data) for data in parse_sse(response.text)]


# ----- completions --------------------------------------------------------------------------


async def test_completion_with_openai_client(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT, eos=True), FinishReason.STOP)
    async with make_client(tokenizer, generator) as http:
        result = await make_openai(http).completions.create(model=MODEL, prompt="Hello",
                                                            max_tokens=30)
    assert result.object == "text_completion" and result.id.startswith("cmpl-")
    assert result.model == MODEL and result.created > 0
    assert result.choices[0].text == OUTPUT
    assert result.choices[0].finish_reason == "stop" and result.choices[0].logprobs is None
    num_generated = len(tokenizer(OUTPUT).input_ids) + 1
    assert result.usage.prompt_tokens == len(tokenizer("Hello").input_ids)
    assert result.usage.completion_tokens == num_generated
    assert result.usage.total_tokens == result.usage.prompt_tokens + num_generated
    assert generator.completed and not generator.closed_early


async def test_streamed_text_equals_non_streamed(tokenizer):
    chunks = script(tokenizer, OUTPUT, per_chunk=1)
    async with make_client(tokenizer, FakeGenerator(chunks)) as http:
        client = make_openai(http)
        whole = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=32)
        stream = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=32,
                                                 stream=True)
        parts = [chunk async for chunk in stream]
    assert whole.choices[0].text == OUTPUT and whole.choices[0].finish_reason == "length"
    assert "".join(p.choices[0].text for p in parts) == OUTPUT
    assert all("\ufffd" not in p.choices[0].text for p in parts)
    assert [p.choices[0].finish_reason for p in parts][-1] == "length"
    assert all(p.choices[0].finish_reason is None for p in parts[:-1])
    assert len({p.id for p in parts}) == 1 and parts[0].object == "text_completion"


async def test_sse_framing_and_usage_chunk(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    async with make_client(tokenizer, generator) as http:
        response, chunks = await stream_post(http, "/v1/completions", {
            "model": MODEL, "prompt": "Hi", "max_tokens": 30, "stream": True,
            "stream_options": {"include_usage": True}, "user": "someone", "logprobs": None})
    assert response.headers["cache-control"] == "no-cache"
    *text_chunks, last = chunks
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in text_chunks)
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert last["choices"] == [] and last["object"] == "text_completion"
    num_prompt, num_output = len(tokenizer("Hi").input_ids), len(tokenizer(OUTPUT).input_ids)
    assert last["usage"] == {"prompt_tokens": num_prompt, "completion_tokens": num_output,
                             "total_tokens": num_prompt + num_output}


async def test_multibyte_characters_split_across_tokens(tokenizer):
    text = "naïve 日本語 café"
    ids = tokenizer(text).input_ids
    assert len(ids) > len(text) - 4  # several characters really span more than one token
    async with make_client(tokenizer, FakeGenerator([[i] for i in ids])) as http:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 30, "stream": True}
        _, chunks = await stream_post(http, "/v1/completions", body)
    pieces = [c["choices"][0]["text"] for c in chunks]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
    assert "日" in pieces or any(p.startswith("日") for p in pieces)


def test_incremental_detokenizer_holds_back_partial_characters(tokenizer):
    ids = tokenizer("日本").input_ids  # six byte tokens
    detok = IncrementalDetokenizer(tokenizer)
    out = [detok.add([i]) for i in ids]
    assert out == ["", "", "日", "", "", "本"]
    detok.add(ids[:1])
    assert detok.flush() == "\ufffd"  # an unfinished character is released at the end


def test_stop_string_matcher_holds_back_possible_starts():
    matcher = StopStringMatcher(["STOP", "\n\n"])
    assert matcher.add("abc ST") == "abc "
    assert matcher.add("x") == "STx"
    assert matcher.add("y\n") == "y"
    assert matcher.add("z ST") == "\nz "
    assert matcher.add("OP and more") == "" and matcher.stopped
    assert matcher.add("later") == "" and matcher.flush() == ""


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_cuts_text_and_closes_generator(tokenizer, stream):
    chunks = script(tokenizer, OUTPUT, per_chunk=2)
    generator = FakeGenerator(chunks)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 30, "stop": ["zzz", "café"],
            "stream": stream, "stream_options": {"include_usage": True}}
    async with make_client(tokenizer, generator) as http:
        if stream:
            _, events = await stream_post(http, "/v1/completions", body)
            text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
            finish = [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]
            usage = events[-1]["usage"]
        else:
            result = (await http.post("/v1/completions", json=body)).json()
            text, finish = result["choices"][0]["text"], result["choices"][0]["finish_reason"]
            usage = result["usage"]
    assert text == OUTPUT[:OUTPUT.index("café")] and finish == "stop"
    assert generator.closed_early and not generator.completed
    assert generator.yielded < len(chunks)
    assert usage["completion_tokens"] == sum(len(c) for c in chunks[:generator.yielded])


async def test_generation_request_mapping(tokenizer):
    generator = FakeGenerator(script(tokenizer, "ok"))
    async with make_client(tokenizer, generator) as http:
        await make_openai(http).completions.create(
            model=MODEL, prompt=["Hello world"], max_tokens=5, temperature=0.5, top_p=0.9, seed=7,
            extra_body={"num_draft_tokens": 2, "top_k": 40})
    request = generator.request
    assert request.prompt_tokens == tokenizer("Hello world").input_ids
    assert request.num_draft_tokens == 2
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_new_tokens) == (0.5, 0.9, 40, 7, 5)
    assert s.stop_token_ids == (tokenizer.eos_token_id,)


async def test_defaults(tokenizer):
    generator = FakeGenerator(script(tokenizer, "ok"))
    async with make_client(tokenizer, generator) as http:
        await http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"})
        await http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"})
    first, second = generator.requests
    assert first.num_draft_tokens == SETTINGS.default_num_draft_tokens
    assert first.sampling.max_new_tokens == 16 and first.sampling.temperature == 1.0
    assert first.sampling.top_k == 0 and first.sampling.top_p == 1.0
    assert 0 <= first.sampling.seed < 2**63 and first.sampling.seed != second.sampling.seed


# ----- chat ---------------------------------------------------------------------------------


async def test_chat_with_openai_client_applies_template(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT, eos=True), FinishReason.STOP)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    async with make_client(tokenizer, generator) as http:
        result = await make_openai(http).chat.completions.create(model=MODEL, messages=messages)
    rendered = "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    assert generator.request.prompt_tokens == tokenizer(rendered).input_ids
    assert generator.request.sampling.max_new_tokens == min(
        SETTINGS.max_tokens_limit, SETTINGS.context_length - len(tokenizer(rendered).input_ids))
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == OUTPUT
    assert result.choices[0].finish_reason == "stop"
    assert result.usage.prompt_tokens == len(tokenizer(rendered).input_ids)


async def test_chat_control_tokens_in_content_stay_text(tokenizer):
    generator = FakeGenerator(script(tokenizer, "ok"))
    async with make_client(tokenizer, generator) as http:
        await http.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user",
                          "content": [{"type": "text", "text": "a<|endoftext|>"}]}]})
    assert tokenizer.eos_token_id not in generator.request.prompt_tokens


async def test_chat_streaming_chunks(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT, per_chunk=2))
    async with make_client(tokenizer, generator) as http:
        _, chunks = await stream_post(http, "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30,
            "stream": True, "stream_options": {"include_usage": True}})
        stream = await make_openai(http).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=30, stream=True)
        sdk_text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    middle = chunks[1:-2]
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in middle)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert "".join(c["choices"][0]["delta"]["content"] for c in middle) == OUTPUT == sdk_text


async def test_chat_without_template_is_rejected(tokenizer):
    plain = build_tokenizer()
    plain.chat_template = None
    async with make_client(plain, FakeGenerator([[1]])) as http:
        response = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == 400
    assert "chat template" in response.json()["error"]["message"]


# ----- errors -------------------------------------------------------------------------------

LONG_PROMPT = "Hello world " * 40
BAD_REQUESTS = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 33}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": LONG_PROMPT}, "prompt"),
    ({"prompt": "Hello world " * 5, "max_tokens": 32}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 2}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 3}, "stop"),
    ({"num_draft_tokens": 33}, "num_draft_tokens"),
    ({"top_k": -1}, "top_k"),
    ({"model": None}, "model"),
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
            await make_openai(http).completions.create(model=MODEL, prompt="Hi", n=3)
    assert broken.status_code == 400 and "JSON" in broken.json()["error"]["message"]
    assert not_object.status_code == 400 and "JSON object" in not_object.json()["error"]["message"]
    assert unknown.status_code == 404
    assert unknown.json()["error"] == {"message": "The model 'gpt-9' does not exist.",
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


async def test_models_health_ready_metrics(tokenizer):
    registry = CollectorRegistry()
    Counter("cascade_test_events", "A test counter.", registry=registry).inc(3)
    state = {"ready": False}

    async def ready() -> bool:
        return state["ready"]

    async with make_client(tokenizer, FakeGenerator([[1]]), ready=ready, registry=registry) as http:
        models = (await http.get("/v1/models")).json()
        sdk_models = [m.id async for m in make_openai(http).models.list()]
        health = await http.get("/health")
        not_ready = await http.get("/ready")
        state["ready"] = True
        is_ready = await http.get("/ready")
        metrics = await http.get("/metrics")
        missing = await http.get("/v1/nothing")
    assert models["object"] == "list" and sdk_models == [MODEL]
    assert models["data"][0] == {"id": MODEL, "object": "model",
                                 "created": models["data"][0]["created"], "owned_by": "cascade"}
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert not_ready.status_code == 503 and is_ready.status_code == 200
    assert "cascade_test_events_total 3.0" in metrics.text
    assert metrics.headers["content-type"].startswith("text/plain")
    assert missing.status_code == 404 and "error" in missing.json()


async def test_ready_by_default(tokenizer):
    async with make_client(tokenizer, FakeGenerator([[1]])) as http:
        assert (await http.get("/ready")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
