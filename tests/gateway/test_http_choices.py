"""Several choices per request: n > 1 and batches of prompts on /v1/completions, n on chat;
each choice a session of its own (seeds derived per choice, a slot of the key each), answered
together, streamed interleaved with each chunk's index, usage totalled."""

from __future__ import annotations

import json

from gateway.limits import KeyLimits

from http_fixtures import MODEL, OUTPUT, FakeGenerator, make_client, make_openai, script


async def test_n_choices_are_sessions_with_derived_seeds(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    async with make_client(tokenizer, generator) as http:
        result = await make_openai(http).completions.create(
            model=MODEL, prompt="Hello", max_tokens=30, n=3, seed=41, temperature=0.8)
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert all(c.text == OUTPUT for c in result.choices)
    assert [r.sampling.seed for r in generator.requests] == [41, 42, 43]
    per_choice = len(tokenizer(OUTPUT).input_ids)
    assert result.usage.prompt_tokens == len(tokenizer("Hello").input_ids)  # the prompt once
    assert result.usage.completion_tokens == 3 * per_choice


async def test_a_batch_of_prompts_answers_each_in_order(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    prompts = ["Hello", "Good morning", tokenizer("Hi there").input_ids]
    async with make_client(tokenizer, generator) as http:
        result = await make_openai(http).completions.create(model=MODEL, prompt=prompts,
                                                            max_tokens=30, n=2)
    assert [c.index for c in result.choices] == list(range(6))
    ids = [tokenizer(p).input_ids if isinstance(p, str) else p for p in prompts]
    assert [r.prompt_tokens for r in generator.requests] == [i for i in ids for _ in range(2)]
    assert result.usage.prompt_tokens == sum(len(i) for i in ids)


async def test_streamed_choices_interleave_with_indices_and_one_usage(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT, per_chunk=2), delay=0.001)
    async with make_client(tokenizer, generator) as http:
        stream = await make_openai(http).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=30, n=2,
            stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: OUTPUT, 1: OUTPUT}
    finished = [c.choices[0].index for c in chunks[:-1] if c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2 * len(
        tokenizer(OUTPUT).input_ids)
    assert all(c.usage is None for c in chunks[:-1])


async def test_each_choice_takes_a_slot_of_the_key(tokenizer):
    limits = KeyLimits(per_key=2)
    async with make_client(tokenizer, FakeGenerator(script(tokenizer, OUTPUT)),
                           limits=limits) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": "Hi", "max_tokens": 4, "n": 3})
        assert response.status_code == 429, response.text
        assert limits.reserve("anonymous").release() is None  # nothing was left taken
        ok = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": "Hi", "max_tokens": 4, "n": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
    assert json.loads(ok.text)["usage"]["completion_tokens"] > 0
