"""The ``cascade_rounds`` stream extension and the playground page's routes."""

from __future__ import annotations


import pytest

from cascade.protocol.settings import FinishReason
from gateway.openai.rounds import token_kinds
from http_fixtures import (
    MODEL,
    OUTPUT,
    REJECTED_TOKEN,
    SETTINGS,
    FakeGenerator,
    make_client,
    make_openai,
    script,
    stream_post,
)


def test_token_kinds():
    assert token_kinds(3, 2, 4) == ["accepted", "accepted", "recovered"]
    assert token_kinds(5, 4, 4) == ["accepted"] * 4 + ["bonus"]
    assert token_kinds(2, 2, 4) == ["accepted", "accepted"]  # cut short by a stop token
    assert token_kinds(1, 0, 0) == ["target"]
    assert token_kinds(1, 0, 3) == ["recovered"]
    assert token_kinds(4, 1, 2, num_filled=2) == ["accepted", "recovered", "filled", "filled"]
    assert token_kinds(3, 0, 0, num_filled=2) == ["target", "filled", "filled"]


@pytest.mark.parametrize("per_chunk, last_kind", [(3, "recovered"), (4, "bonus")])
async def test_each_round_is_a_chunk_with_its_tokens(tokenizer, per_chunk, last_kind):
    chunks = script(tokenizer, OUTPUT, per_chunk=per_chunk)
    generator = FakeGenerator(chunks)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 32, "stream": True,
            "cascade_rounds": True}
    async with make_client(tokenizer, generator) as http:
        _, events = await stream_post(http, "/v1/completions", body)
    rounds = [event["cascade"] for event in events if "cascade" in event]
    assert [r["round"] for r in rounds] == list(range(len(chunks)))
    text = "".join(event["choices"][0]["text"] for event in events)
    assert "".join(t["text"] for r in rounds for t in r["tokens"]) == text == OUTPUT
    for ids, r in zip(chunks, rounds, strict=True):
        assert len(r["tokens"]) == len(ids) and r["num_accepted"] == len(ids) - 1
        kinds = [t["kind"] for t in r["tokens"]]
        expected_last = last_kind if len(ids) == per_chunk else "recovered"
        assert kinds == ["accepted"] * (len(ids) - 1) + [expected_last]
        assert r["num_drafted"] == len(r["drafted"]) == 3
        assert (r["draft_ms"], r["verify_ms"], r["round_ms"]) == (1.5, 2.5, 4.2)
    assert [r["block"] for r in rounds[:2]] == ["ahead_hit", "cache_hit"]  # the fake alternates
    short = next(r for ids, r in zip(chunks, rounds, strict=True) if len(ids) - 1 < 3)
    assert short["drafted"][-1] == tokenizer.decode([REJECTED_TOKEN])


async def test_held_back_text_keeps_a_chunk_per_round(tokenizer):
    """A stop string's possible start is held back, yet every round still gets its chunk, and
    the tokens after the stop string add no text."""
    chunks = script(tokenizer, "abc STOP and more words after it", per_chunk=1)
    generator = FakeGenerator(chunks)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "cascade_rounds": True, "stop": ["STOP"]}
    async with make_client(tokenizer, generator) as http:
        _, events = await stream_post(http, "/v1/chat/completions", body)
    rounds = [event["cascade"] for event in events if "cascade" in event]
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert content == "abc " == "".join(t["text"] for r in rounds for t in r["tokens"])
    assert len(rounds) == generator.yielded  # rounds up to the stop string, none dropped
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


async def test_openai_client_parses_extended_chunks(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT), FinishReason.STOP)
    async with make_client(tokenizer, generator) as http:
        stream = await make_openai(http).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True,
            extra_body={"cascade_rounds": True})
        chunks = [chunk async for chunk in stream]
    extended = [c for c in chunks if (c.model_extra or {}).get("cascade")]
    assert len(extended) == generator.yielded
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == OUTPUT
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_without_the_field_chunks_are_plain(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 32, "stream": True}
    async with make_client(tokenizer, generator) as http:
        _, events = await stream_post(http, "/v1/completions", body)
    assert events and not any("cascade" in event for event in events)


async def test_rounds_need_a_stream(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    body = {"model": MODEL, "prompt": "Hi", "cascade_rounds": True}
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "cascade_rounds" and "stream" in error["message"]
    assert not generator.requests


async def test_playground_page_and_settings_are_public(tokenizer):
    settings = SETTINGS.model_copy(update={"api_keys": ("secret",)})
    async with make_client(tokenizer, FakeGenerator([]), settings=settings) as http:
        page = await http.get("/playground/")
        script_file = await http.get("/playground/playground.js")
        page_settings = (await http.get("/playground/settings.json")).json()
        api = await http.get("/v1/models")
        root = await http.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/playground/"
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'id="request-form"' in page.text and "playground.js" in page.text
    assert script_file.status_code == 200 and "cascade_rounds" in script_file.text
    assert page_settings["model"] == MODEL and "model" in page_settings["draft_methods"]
    assert page_settings["default_num_draft_tokens"] == SETTINGS.num_draft_tokens
    assert api.status_code == 401  # the API itself still wants the key


async def test_playground_can_be_turned_off(tokenizer):
    settings = SETTINGS.model_copy(update={"playground": False})
    async with make_client(tokenizer, FakeGenerator([]), settings=settings) as http:
        assert (await http.get("/playground/")).status_code == 404
        assert (await http.get("/playground/settings.json")).status_code == 404
        assert (await http.get("/")).status_code == 404
