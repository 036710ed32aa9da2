"""echo on /v1/completions through the HTTP layer (a scripted generator whose first round
carries the prompt's log-probabilities, as the verifier sends them): text, logprobs shape,
max_tokens 0, streaming, several choices, and what is refused or ignored."""

from __future__ import annotations

from dataclasses import replace

from cascade.protocol.logprobs import TokenLogprobs
from cascade.protocol.settings import FinishReason

from http_fixtures import MODEL, FakeGenerator, make_client, make_openai, script, stream_post

PROMPT = "Hello there world"
OUTPUT = " and more"


def fake_logprobs(ids: list[int], shift: float, top: int = 2) -> tuple[TokenLogprobs, ...]:
    """Made-up entries: token i at -(i + shift), its likeliest alternatives ids 1 and 2."""
    return tuple(TokenLogprobs(-(i + shift), (1, 2)[:top], (-0.5, -0.75)[:top])
                 for i in range(len(ids)))


class ScoringGenerator(FakeGenerator):
    """A FakeGenerator whose rounds carry log-probabilities, the first the prompt's too (when
    the request asked for them)."""

    async def generate(self, request):
        first = True
        async for chunk in super().generate(request):
            extra = {"logprobs": fake_logprobs(chunk.token_ids, 10.0)}
            if first and request.sampling.prompt_logprobs is not None:
                extra["prompt_logprobs"] = fake_logprobs(request.prompt_tokens[1:], 0.0,
                                                         request.sampling.prompt_logprobs)
            first = False
            yield replace(chunk, **extra)


async def test_echo_with_logprobs_puts_the_prompt_first(tokenizer):
    prompt_ids = tokenizer(PROMPT).input_ids
    generator = ScoringGenerator(script(tokenizer, OUTPUT, per_chunk=2))
    async with make_client(tokenizer, generator) as http:
        result = await make_openai(http).completions.create(
            model=MODEL, prompt=PROMPT, echo=True, logprobs=2, max_tokens=5)
    assert generator.request.sampling.prompt_logprobs == 2
    choice = result.choices[0]
    assert choice.text == PROMPT + OUTPUT
    logprobs = choice.logprobs
    texts = [tokenizer.decode([t]) for t in prompt_ids]
    assert logprobs.tokens[:len(prompt_ids)] == texts
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:len(prompt_ids)] == [-i for i in range(len(prompt_ids) - 1)]
    for j in range(1, len(prompt_ids)):  # the top 2, and the token itself unless among them
        top = logprobs.top_logprobs[j]
        assert top[tokenizer.decode([1])] == -0.5 and top[texts[j]] == -(j - 1)
    assert logprobs.text_offset[:2] == [0, len(texts[0])]
    generated = len(logprobs.tokens) - len(prompt_ids)
    assert generated == len(tokenizer(OUTPUT).input_ids) == result.usage.completion_tokens


async def test_max_tokens_zero_with_echo_answers_the_prompt_alone(tokenizer):
    generator = ScoringGenerator([tokenizer(" x").input_ids[:1]])
    async with make_client(tokenizer, generator) as http:
        body = {"model": MODEL, "prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 0}
        result = (await http.post("/v1/completions", json=body)).json()
        refused = await http.post("/v1/completions", json={**body, "echo": False})
    assert generator.request.sampling.max_new_tokens == 1  # one token, left out
    choice = result["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(tokenizer(PROMPT).input_ids)
    assert all(len(top) == 1 for top in choice["logprobs"]["top_logprobs"][1:])  # itself
    assert result["usage"]["completion_tokens"] == 0
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


async def test_a_streamed_echo_sends_the_prompt_in_the_first_chunk(tokenizer):
    generator = ScoringGenerator(script(tokenizer, OUTPUT, per_chunk=1))
    async with make_client(tokenizer, generator) as http:
        _, chunks = await stream_post(http, "/v1/completions", {
            "model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 5,
            "stream": True})
    first = chunks[0]["choices"][0]
    assert first["text"].startswith(PROMPT) and first["logprobs"]["token_logprobs"][0] is None
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT + OUTPUT
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


async def test_echo_of_token_ids_and_of_several_choices(tokenizer):
    ids = tokenizer(PROMPT).input_ids
    generator = ScoringGenerator(script(tokenizer, OUTPUT), FinishReason.LENGTH)
    async with make_client(tokenizer, generator) as http:
        result = await make_openai(http).completions.create(
            model=MODEL, prompt=[ids, "Hi"], n=2, echo=True, max_tokens=4)
    texts = [c.text for c in sorted(result.choices, key=lambda c: c.index)]
    assert texts == [tokenizer.decode(ids) + OUTPUT] * 2 + ["Hi" + OUTPUT] * 2
    assert all(c.logprobs is None for c in result.choices)
    assert all(r.sampling.prompt_logprobs is None for r in generator.requests)


async def test_echo_without_the_verifiers_prompt_logprobs_fails_rather_than_lies(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))  # rounds carry nothing
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 4})
    assert response.status_code == 500
    assert "prompt log-probabilities" in response.json()["error"]["message"]


async def test_echo_on_chat_is_ignored_like_any_unknown_field(tokenizer):
    generator = FakeGenerator(script(tokenizer, OUTPUT))
    async with make_client(tokenizer, generator) as http:
        response = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "echo": True,
            "max_tokens": 4})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == OUTPUT
    assert generator.request.sampling.prompt_logprobs is None


async def test_echo_must_be_a_boolean(tokenizer):
    async with make_client(tokenizer, FakeGenerator([[1]])) as http:
        response = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "echo": "yes"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "echo"


async def test_best_of_ranks_echoed_candidates_by_their_log_probabilities(tokenizer):
    """The prompt's first entry has no log-probability; ranking still works (the prompt's
    entries are the same for every candidate of a prompt)."""
    generator = ScoringGenerator(script(tokenizer, OUTPUT))
    async with make_client(tokenizer, generator) as http:
        result = (await http.post("/v1/completions", json={
            "model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 4,
            "best_of": 2, "n": 1})).json()
    choice = result["choices"][0]
    assert choice["text"] == PROMPT + OUTPUT and choice["logprobs"]["token_logprobs"][0] is None


async def test_a_long_prompts_entries_are_built_off_the_event_loop(tokenizer, monkeypatch):
    """Building the echoed prompt's entries (each token and its alternatives decoded) takes a
    while for a long prompt: it runs in a worker thread, so /health answers meanwhile (on the
    event loop the wait below would time out)."""
    import asyncio
    import threading

    from gateway.openai import echo

    building, health_answered, waited = threading.Event(), threading.Event(), []
    entries = echo.prompt_entries

    def slow_entries(*args):
        building.set()
        waited.append(health_answered.wait(timeout=5.0))
        return entries(*args)

    monkeypatch.setattr(echo, "prompt_entries", slow_entries)
    generator = ScoringGenerator(script(tokenizer, OUTPUT))
    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 3}
    async with make_client(tokenizer, generator) as http:
        async def health():
            while not building.is_set():
                await asyncio.sleep(0.01)
            response = await http.get("/health")
            health_answered.set()
            return response

        echoed, checked = await asyncio.gather(http.post("/v1/completions", json=body),
                                               health())
    assert echoed.status_code == 200 and checked.status_code == 200
    assert echoed.json()["choices"][0]["text"].startswith(PROMPT)
    assert waited == [True]
