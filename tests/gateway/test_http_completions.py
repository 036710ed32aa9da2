"""Completions through the OpenAI-compatible HTTP layer: the openai client, SSE framing,
incremental detokenization, stop strings, request mapping and defaults."""

from __future__ import annotations

import pytest

from cascade.protocol.settings import FinishReason
from gateway.openai.detokenize import IncrementalDetokenizer, StopStringMatcher

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
    spec = last["usage"].pop("cascade")
    assert last["usage"] == {"prompt_tokens": num_prompt, "completion_tokens": num_output,
                             "total_tokens": num_prompt + num_output}
    rounds = script(tokenizer, OUTPUT)  # each round drafts 3, accepts all its tokens but one
    accepted = sum(len(ids) - 1 for ids in rounds)
    assert spec == {"rounds": len(rounds), "drafted_rounds": len(rounds),
                    "draft_tokens": 3 * len(rounds), "accepted_tokens": accepted,
                    "acceptance_rate": round(accepted / (3 * len(rounds)), 4),
                    "mean_acceptance_length": round(1 + accepted / len(rounds), 4)}


async def test_non_streamed_usage_says_what_speculation_did(tokenizer):
    async with make_client(tokenizer, FakeGenerator([[1, 2, 3], [4, 5]])) as http:
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 5, "n": 2}
        usage = (await http.post("/v1/completions", json=body)).json()["usage"]
    assert usage["completion_tokens"] == 10  # two choices of the scripted 5 tokens
    assert usage["cascade"] == {"rounds": 4, "drafted_rounds": 4, "draft_tokens": 12,
                                "accepted_tokens": 6, "acceptance_rate": 0.5,
                                "mean_acceptance_length": 2.5}


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
    assert generator.stopped and not generator.completed  # ended as a stop, not abandoned
    assert generator.yielded < len(chunks)
    ids = [t for c in chunks for t in c]  # counted up to the token that completes "café"
    assert usage["completion_tokens"] == next(
        n for n in range(len(ids)) if "café" in tokenizer.decode(ids[:n]))


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
    assert first.num_draft_tokens == SETTINGS.num_draft_tokens
    assert first.sampling.max_new_tokens == 16 and first.sampling.temperature == 1.0
    assert first.sampling.top_k == 0 and first.sampling.top_p == 1.0
    assert 0 <= first.sampling.seed < 2**63 and first.sampling.seed != second.sampling.seed


# ----- chat ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["ids", "one list of ids"])
async def test_a_token_id_prompt_is_generated_from_as_given(tokenizer, shape):
    ids = tokenizer("Hello there").input_ids
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    async with make_client(tokenizer, generator) as http:
        result = await make_openai(http).completions.create(
            model=MODEL, prompt=ids if shape == "ids" else [ids], max_tokens=30)
    assert generator.requests[0].prompt_tokens == ids
    assert result.usage.prompt_tokens == len(ids) and result.choices[0].text == OUTPUT
