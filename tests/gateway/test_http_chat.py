"""Chat completions: the chat template, control tokens in content, streaming chunks."""

from __future__ import annotations

from cascade.protocol.settings import FinishReason
from tokenizers_fixture import build_tokenizer

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
