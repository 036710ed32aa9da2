"""echo on /v1/completions through the whole cluster, with the official openai client: the
prompt, then exactly what the same request without echo returns; the prompt's
log-probabilities are the target's own, computed by the verifier in the pass that first feeds
the prompt, whatever that pass also verifies."""

import grpc
import httpx
import openai
import pytest
import torch

from cascade.v1 import gateway_pb2, gateway_pb2_grpc

PROMPT = "def main(): return"
TOP = 3


def prompt_reference(cluster, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, vocab] the target's log-softmax before each prompt token after the first,
    from one plain forward pass."""
    with torch.no_grad():
        logits = cluster.target.model(torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits.float(), -1)


def check_prompt_part(cluster, logprobs, top: int = TOP) -> int:
    """The prompt's entries (the first ones) against the reference; returns how many."""
    tokenizer = cluster.target.tokenizer
    ids = tokenizer(PROMPT).input_ids
    reference = prompt_reference(cluster, ids)
    n = len(ids)
    assert logprobs.tokens[:n] == [tokenizer.decode([t]) for t in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = reference.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(logprobs.token_logprobs[1:n]), expected, atol=1e-4)
    for j in range(1, n):
        alternatives = logprobs.top_logprobs[j]
        best = sorted(alternatives.values(), reverse=True)[:top]
        assert best == pytest.approx(torch.topk(reference[j - 1], top).values.tolist(),
                                     abs=1e-4)
        assert alternatives[logprobs.tokens[j]] == pytest.approx(logprobs.token_logprobs[j])
    assert logprobs.text_offset[:n] == [sum(len(t) for t in logprobs.tokens[:i])
                                        for i in range(n)]
    return n


@pytest.mark.parametrize("draft", [{"num_draft_tokens": 0},
                                   {"num_draft_tokens": 4, "draft_schedule": "fixed"}],
                         ids=["target-alone", "k4"])
async def test_echo_is_the_prompt_with_the_targets_logprobs_then_the_completion(cluster, draft):
    client = openai.AsyncOpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused")
    args = dict(model="tiny", prompt=PROMPT, logprobs=TOP, max_tokens=8, temperature=0,
                extra_body=draft)
    plain = (await client.completions.create(**args)).choices[0]
    echoed = (await client.completions.create(echo=True, **args)).choices[0]
    assert echoed.text == PROMPT + plain.text
    n = check_prompt_part(cluster, echoed.logprobs)
    generated, expected = echoed.logprobs, plain.logprobs
    assert generated.tokens[n:] == expected.tokens
    assert generated.token_logprobs[n:] == pytest.approx(expected.token_logprobs, abs=1e-5)
    for got, want in zip(generated.top_logprobs[n:], expected.top_logprobs):
        assert got == pytest.approx(want, abs=1e-5)
    start = sum(len(t) for t in generated.tokens[:n])
    assert generated.text_offset[n:] == [start + o for o in expected.text_offset]


async def test_max_tokens_zero_scores_the_prompt_alone(cluster):
    """lm-evaluation-harness's loglikelihood request: echo, max_tokens 0, logprobs."""
    client = openai.AsyncOpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused")
    result = await client.completions.create(model="tiny", prompt=PROMPT, echo=True,
                                             logprobs=TOP, max_tokens=0, temperature=0)
    choice = result.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert check_prompt_part(cluster, choice.logprobs) == len(choice.logprobs.tokens)
    assert result.usage.completion_tokens == 0
    assert result.usage.prompt_tokens == len(choice.logprobs.tokens)


async def test_a_streamed_echo_starts_with_the_prompt(cluster):
    client = openai.AsyncOpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused")
    args = dict(model="tiny", prompt=PROMPT, logprobs=1, max_tokens=8, temperature=0,
                extra_body={"num_draft_tokens": 3})
    whole = (await client.completions.create(echo=True, **args)).choices[0]
    chunks = [c async for c in await client.completions.create(echo=True, stream=True, **args)]
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    streamed = [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None
    assert streamed[1:] == pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-5)


async def test_what_is_refused_and_what_is_ignored(cluster):
    """max_tokens 0 without echo is a 400 naming max_tokens; echo is no chat field, and like
    any unknown field it is ignored there."""
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        refused = await http.post("/v1/completions", json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 0})
        chat = await http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "echo": True,
            "max_tokens": 2, "temperature": 0})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    assert chat.status_code == 200
    assert not chat.json()["choices"][0]["message"]["content"].startswith("Hi")


async def test_grpc_generate_returns_the_prompts_logprobs_first(cluster):
    ids = cluster.target.tokenizer(PROMPT).input_ids
    reference = prompt_reference(cluster, ids)
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        responses = [r async for r in stub.Generate(gateway_pb2.GenerateRequest(
            prompt=PROMPT, max_tokens=6, temperature=0, num_draft_tokens=2,
            prompt_logprobs=2), timeout=60)]
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            [r async for r in stub.Generate(gateway_pb2.GenerateRequest(
                prompt=PROMPT, max_tokens=2, prompt_logprobs=21), timeout=60)]
    first = responses[0]
    assert list(first.prompt_token_ids) == ids and len(first.prompt_logprobs) == len(ids) - 1
    expected = reference.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    got = torch.tensor([e.logprob for e in first.prompt_logprobs])
    assert torch.allclose(got, expected, atol=1e-4)
    assert all(len(e.top_ids) == 2 for e in first.prompt_logprobs)
    assert not any(r.prompt_logprobs or r.prompt_token_ids for r in responses[1:])
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_logprobs" in failure.value.details()
