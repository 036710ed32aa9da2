"""What one client can take: body size (413), concurrent sessions and tokens per minute per key
(429), a non-streamed request whose client left is cancelled, and no service starts open unless
told to."""

import asyncio
import threading

import httpx
import pytest
import typer
import uvicorn

from cascade.serving.mesh.security import refuse_open
from cascade.tools.redis_server import free_port
from gateway.sessions.generation import GeneratedChunk
from gateway.http_app import create_app
from gateway.settings import HttpSettings
from http_fixtures import MODEL, OUTPUT, FakeGenerator, script

LIMITED = HttpSettings(model_name=MODEL, context_length=64, max_tokens_limit=32,
                       max_body_bytes=2048, max_sessions_per_key=1)
KEYED = LIMITED.model_copy(update={"api_keys": ("k1", "k2")})


def client(tokenizer, generator, settings=LIMITED) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(settings, tokenizer, generator))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def completion(prompt: str = "hello", stream: bool = False) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 8, "stream": stream}


async def test_an_oversized_body_gets_413_before_anything_runs(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    async with client(tokenizer, generator) as http:
        declared = await http.post("/v1/completions", json=completion("x" * 4000))
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "request_too_large"
        assert "2048 bytes" in declared.json()["error"]["message"]

        async def chunked():  # no Content-Length: refused once the body crosses the limit
            for _ in range(10):
                yield b" " * 500

        streamed = await http.post("/v1/completions", content=chunked(),
                                   headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        fits = await http.post("/v1/completions", json=completion("x" * 100))
        assert fits.status_code != 413
    assert len(generator.requests) <= 1  # only the one that fit reached the generator


async def test_a_key_runs_at_most_its_limit_of_sessions_at_once(tokenizer):
    generator = FakeGenerator(script(tokenizer, "Hello world again"), delay=0.3)
    async with client(tokenizer, generator, KEYED) as http:
        first = asyncio.create_task(http.post("/v1/completions", json=completion(),
                                              headers={"authorization": "Bearer k1"}))
        while not generator.requests:
            await asyncio.sleep(0.01)
        second = await http.post("/v1/completions", json=completion(),
                                 headers={"authorization": "Bearer k1"})
        assert second.status_code == 429
        assert second.json()["error"]["code"] == "rate_limit_exceeded"
        assert "concurrent sessions" in second.json()["error"]["message"]
        assert second.headers["retry-after"] == "1"
        other = await http.post("/v1/completions", json=completion(),
                                headers={"authorization": "Bearer k2"})
        assert other.status_code == 200  # another key has its own limit
        assert (await first).status_code == 200
        again = await http.post("/v1/completions", json=completion(),
                                headers={"authorization": "Bearer k1"})
        assert again.status_code == 200  # the finished session no longer counts


async def test_a_key_spends_at_most_its_tokens_per_minute(tokenizer):
    """The prompt's tokens count with the generated ones, and each session holds its
    max_tokens until it generates them or ends: n choices of many tokens cannot all pass a
    check that only saw what was spent, and what a session did not generate comes back."""
    prompt = "hello " * 2
    num_prompt = len(tokenizer(prompt).input_ids)
    assert 8 < num_prompt < 16  # more than max_tokens; a request of 2 x cost + 1 fits 32
    cost = num_prompt + 8  # the prompt plus max_tokens
    settings = HttpSettings(model_name=MODEL, context_length=64, max_tokens_limit=32,
                            tokens_per_minute_per_key=2 * cost, api_keys=("k1", "k2"))
    generator = FakeGenerator(script(tokenizer, "Hello world"))
    k1, k2 = {"authorization": "Bearer k1"}, {"authorization": "Bearer k2"}
    body = completion(prompt)
    async with client(tokenizer, generator, settings) as http:
        burst = await http.post("/v1/completions", json={**body, "n": 3}, headers=k1)
        assert burst.status_code == 429 and "max_tokens" in burst.text
        first = await http.post("/v1/completions", json=body, headers=k1)
        assert first.status_code == 200  # the burst's holds were given back
        assert first.json()["usage"]["completion_tokens"] < 8
        second = await http.post("/v1/completions", json=body, headers=k1)
        assert second.status_code == 200  # so were the tokens first did not generate
        over = await http.post("/v1/completions", json=body, headers=k1)
        assert over.status_code == 429 and "last minute" in over.text  # prompts count
        assert 55 <= int(over.headers["retry-after"]) <= 60
        other = await http.post("/v1/completions", json=body, headers=k2)
        assert other.status_code == 200
        never = await http.post("/v1/completions", json={**body, "max_tokens": cost + 9},
                                headers=k2)
        assert never.status_code == 429 and "lower max_tokens" in never.text, never.text


class Served:
    """The app on a real loopback server (streams and disconnects as a client sees them)."""

    def __init__(self, tokenizer, generator) -> None:
        self.port = free_port()
        app = create_app(LIMITED, tokenizer, generator)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/completions"

    async def __aenter__(self) -> "Served":
        self.thread.start()
        while not self.server.started:
            await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 10)


async def test_a_streamed_session_counts_until_its_stream_ends(tokenizer):
    generator = FakeGenerator(script(tokenizer, "Hello world again"), delay=0.2)
    async with Served(tokenizer, generator) as served, httpx.AsyncClient(timeout=30) as http:
        async with http.stream("POST", served.url, json=completion(stream=True)) as first:
            assert first.status_code == 200
            refused = await http.post(served.url, json=completion())
            assert refused.status_code == 429
            await first.aread()
        assert (await http.post(served.url, json=completion())).status_code == 200


async def test_a_non_streamed_request_is_cancelled_when_its_client_leaves(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT, per_chunk=1), delay=0.5)
    async with Served(tokenizer, generator) as served:
        async with httpx.AsyncClient(timeout=0.8) as http:
            with pytest.raises(httpx.ReadTimeout):  # the client gives up and disconnects
                await http.post(served.url, json=completion())
        for _ in range(50):
            if generator.closed_early:
                break
            await asyncio.sleep(0.1)
    assert generator.closed_early and not generator.completed
    assert generator.yielded < len(generator.chunks)


@pytest.mark.parametrize("credentials,allow,refused", [
    (False, False, True), (True, False, False), (False, True, False), (True, True, False),
])
def test_nothing_serves_open_unless_asked(credentials, allow, refused):
    if refused:
        with pytest.raises(typer.BadParameter, match="--allow-open"):
            refuse_open(credentials, allow, "API keys")
    else:
        refuse_open(credentials, allow, "API keys")


async def test_a_burst_gets_exactly_the_limit_of_sessions(tokenizer):
    """Ten requests of one key arriving together: the slot is taken at the check, so only
    max_sessions_per_key of them run; the rest get 429 before anything runs."""
    settings = KEYED.model_copy(update={"max_sessions_per_key": 2})
    generator = FakeGenerator(script(tokenizer, "Hello world again"), delay=0.3)
    async with client(tokenizer, generator, settings) as http:
        replies = await asyncio.gather(*[
            http.post("/v1/completions", json=completion(stream=stream),
                      headers={"authorization": "Bearer k1"})
            for stream in [False, True] * 5])
    codes = sorted(r.status_code for r in replies)
    assert codes == [200] * 2 + [429] * 8
    assert len(generator.requests) == 2


async def test_without_api_keys_every_client_shares_one_bucket(tokenizer):
    """With keys off a bearer string means nothing, so it cannot buy a bucket of its own."""
    generator = FakeGenerator(script(tokenizer, "Hello world again"), delay=0.3)
    async with client(tokenizer, generator) as http:
        first = asyncio.create_task(http.post("/v1/completions", json=completion(),
                                              headers={"authorization": "Bearer a"}))
        while not generator.requests:
            await asyncio.sleep(0.01)
        other = await http.post("/v1/completions", json=completion(),
                                headers={"authorization": "Bearer b"})
        assert other.status_code == 429
        assert (await first).status_code == 200


async def test_a_slot_is_given_back_even_when_closing_the_stream_is_cut_short():
    """Closing a generation can hang (Redis down while its final status is written); the
    closer gives up after a while, and the key's slot must come back all the same."""
    import anyio

    from gateway.limits import KeyLimits

    class HangsOnClose:
        def __aiter__(self):
            return self

        async def __anext__(self):
            return GeneratedChunk("s", [1], None)

        async def aclose(self):
            await asyncio.sleep(3600)

    limits = KeyLimits(per_key=1)
    chunks = limits.counted(limits.reserve("k"), HangsOnClose())
    await anext(chunks)
    with anyio.move_on_after(0.1, shield=True):
        await chunks.aclose()
    assert limits.active["k"] == 0
    limits.reserve("k").release()  # the key can start a session again

