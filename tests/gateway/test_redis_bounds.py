"""One API key cannot push the shared Redis toward its maxmemory: what a
session stores is bounded whatever its request says, an ended session's keys expire at the
shorter finished TTL, and the speculation memory's stream stays under its byte cap. Against a
real Redis server."""

from __future__ import annotations

import json

import pytest

from cascade.protocol.request.options import MAX_STOP_CHARS
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.limits import MAX_BAD_WORDS
from cascade.serving import memory_stream
from gateway.sessions.generation import GenerationRequest
from gateway.sessions.session_store import SessionStore, session_keys
from http_fixtures import MODEL, FakeGenerator, make_client, script

REQUEST = GenerationRequest([5, 6, 7], SamplingParams(max_new_tokens=8), DraftConfig(4))
RECORD_BESIDES_PROMPT = 48 * 1024
"""Most bytes a session's record holds besides its prompt's ids, whatever the request."""


async def test_the_largest_request_stores_a_bounded_record(redis_client, tokenizer):
    """Stop strings (in the stream's view) and bad words (as token ids) at their limits: the
    record stays small next to the prompt, which the context bounds."""
    generator = FakeGenerator(script(tokenizer, "ok"))
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": "Hello world", "max_tokens": 4,
            "stop": ["\U0001F600\u2028\"" * (MAX_STOP_CHARS // 3)] * 4,  # escaped in JSON
            "bad_words": [f"w{i}" for i in range(MAX_BAD_WORDS // 2)],
            "logit_bias": {str(i): 1.0 for i in range(300)}})
        assert response.status_code == 200, response.text[:300]
        too_long = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": "Hello world", "max_tokens": 4,
            "stop": ["x" * (MAX_STOP_CHARS + 1)]})
        assert too_long.status_code == 400
    store = SessionStore(redis_client)
    record = await store.create(generator.request, "d:1", "v:1")
    stored = await redis_client.hgetall(session_keys(record.session_id)[0])
    size = sum(len(k) + len(v) for k, v in stored.items())
    prompt = len(json.dumps(generator.request.prompt_tokens))
    assert size - prompt < RECORD_BESIDES_PROMPT, size


async def _ttls(client, session_id: str) -> list[int]:
    return [await client.ttl(key) for key in session_keys(session_id)]


async def test_an_ended_session_expires_at_the_shorter_finished_ttl(redis_client):
    store = SessionStore(redis_client, ttl_s=3600, finished_ttl_s=60)

    async def session(tokens=(1, 2)) -> str:
        sid = (await store.create(REQUEST, "d:1", "v:1")).session_id
        await store.append(sid, 1, 0, list(tokens))
        return sid

    running, cancelled = await session(), await session()
    await store.finish(cancelled, 1, "cancelled")  # resumable: kept as long as a running one
    for sid in (running, cancelled):
        assert all(3500 < ttl <= 3600 for ttl in await _ttls(redis_client, sid))

    by_last_round = (await store.create(REQUEST, "d:1", "v:1")).session_id
    await store.append(by_last_round, 1, 0, [1, 2], finish_reason="length")
    stopped, failed = await session(), await session()
    await store.finish(stopped, 1, "finished", "stop")  # a stop string ended it
    await store.finish(failed, 1, "failed")
    restored = (await store.create(REQUEST, "d:1", "v:1")).session_id
    await store.restore(restored, REQUEST, 1, "d:1", "v:1", [1, 2, 3], [3], "length")
    for sid in (by_last_round, stopped, failed, restored):
        assert all(0 < ttl <= 60 for ttl in await _ttls(redis_client, sid)), sid


def test_the_finished_ttl_is_never_longer_than_the_ttl(redis_client):
    assert SessionStore(redis_client, ttl_s=30).finished_ttl_s == 30
    with pytest.raises(ValueError):
        SessionStore(redis_client, finished_ttl_s=0)


async def _stream_bytes(client) -> int:
    """The stream's entries' bytes as the cap counts them."""
    entries = await client.xrange(memory_stream.STREAM)
    return sum(memory_stream.ENTRY_OVERHEAD_BYTES
               + sum(len(k) + len(v) for k, v in fields.items()) for _, fields in entries)


async def test_the_memory_stream_stays_under_its_byte_cap(redis_client):
    """Generations of any length, many of them long: the stream's bytes never exceed the cap
    (the count kept beside it is exact), the newest entry is always kept, and the entry cap
    still holds."""
    cap = 40_000
    for i in range(120):
        output = list(range((i * 7919) % 3000 if i % 5 else 20))
        assert await memory_stream.append(redis_client, "m|key:a", [1, 2, 3], output,
                                          max_len=50, max_bytes=cap)
        total = int(await redis_client.get(memory_stream.bytes_key()))
        assert total == await _stream_bytes(redis_client) <= cap
        newest = (await redis_client.xrevrange(memory_stream.STREAM, count=1))[0][1]
        assert memory_stream.decode(newest)[1] == [1, 2, 3] + output
        assert await redis_client.xlen(memory_stream.STREAM) <= 50
    many_small = [await memory_stream.append(redis_client, "m|key:a", [1], [2], max_len=50,
                                             max_bytes=cap) for _ in range(60)]
    assert all(many_small) and await redis_client.xlen(memory_stream.STREAM) == 50


async def test_a_generation_larger_than_the_cap_is_not_kept(redis_client):
    await memory_stream.append(redis_client, "m|key:a", [1], [2, 3], max_bytes=10_000)
    assert not await memory_stream.append(redis_client, "m|key:a", list(range(5000)), [],
                                          max_bytes=10_000)
    assert await redis_client.xlen(memory_stream.STREAM) == 1


async def test_a_stream_of_unknown_size_starts_over(redis_client):
    """Entries written before the byte cap (no count beside them) cannot be counted: the next
    append trims them, so the cap holds from then on."""
    for _ in range(5):
        await redis_client.xadd(memory_stream.STREAM, memory_stream.encode("m|shared", [1], [2]))
    await memory_stream.append(redis_client, "m|shared", [3], [4], max_bytes=10_000)
    entries = await redis_client.xrange(memory_stream.STREAM)
    assert [memory_stream.decode(f)[1] for _, f in entries] == [[3, 4]]
    assert int(await redis_client.get(memory_stream.bytes_key())) == await _stream_bytes(
        redis_client)


async def test_the_byte_cap_is_sized_against_maxmemory(redis_client):
    before = (await redis_client.config_get("maxmemory"))["maxmemory"]
    try:
        assert await memory_stream.fit_to_maxmemory(redis_client, 10**9) == 10**9  # none set
        await redis_client.config_set("maxmemory", 8 << 20)
        assert await memory_stream.fit_to_maxmemory(redis_client, 10**9) == 2 << 20
        assert await memory_stream.fit_to_maxmemory(redis_client, 1 << 20) == 1 << 20
    finally:
        await redis_client.config_set("maxmemory", before)
