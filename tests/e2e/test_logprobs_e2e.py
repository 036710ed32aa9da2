"""logprobs through the whole cluster: every emitted token's log-probability (and its top
alternatives) is the target's own at that position, computed by the verifier in the pass that
verified it, whatever drafted the token (speculative rounds, the verifier alone), streamed or
not, on both APIs."""

import json

import httpx
import pytest
import torch

from cluster_expectations import expected_tokens

PROMPT = "def main():"
MAX_TOKENS = 12


def target_logprobs(cluster, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
    """[len(generated), vocab] the target's log-softmax before each generated token."""
    with torch.no_grad():
        logits = cluster.target.model(torch.tensor([prompt_ids + generated])).logits[0]
    return torch.log_softmax(logits[len(prompt_ids) - 1:-1].float(), -1)


@pytest.mark.parametrize("draft", [{"num_draft_tokens": 0}, {"num_draft_tokens": 3},
                                   {"num_draft_tokens": 3, "draft_tree_nodes": 8}],
                         ids=["target-alone", "chains", "trees"])
async def test_completion_logprobs_are_the_targets(cluster, draft):
    tokenizer = cluster.target.tokenizer
    prompt_ids = tokenizer(PROMPT).input_ids
    generated = expected_tokens(cluster, PROMPT, MAX_TOKENS)
    reference = target_logprobs(cluster, prompt_ids, generated)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
            "draft_schedule": "fixed", "logprobs": 3, **draft}
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        result = (await http.post("/v1/completions", json=body)).json()
    logprobs = result["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(generated)
    expected = reference.gather(-1, torch.tensor(generated).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(logprobs["token_logprobs"]), expected, atol=1e-4)
    for j, top in enumerate(logprobs["top_logprobs"]):
        best = torch.topk(reference[j], 3)
        assert list(top.values()) == pytest.approx(best.values.tolist(), abs=1e-4)
        assert max(top.values()) == pytest.approx(logprobs["token_logprobs"][j], abs=1e-4)
    assert logprobs["tokens"] == [tokenizer.decode([t]) for t in generated]


async def test_streamed_chat_logprobs_cover_every_token(cluster):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "num_draft_tokens": 2,
            "logprobs": True, "top_logprobs": 2, "stream": True,
            "stream_options": {"include_usage": True}}
    content, usage = [], None
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    if choice.get("logprobs"):
                        content += choice["logprobs"]["content"]
    assert len(content) == usage["completion_tokens"] > 0
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    assert all(c["logprob"] == pytest.approx(c["top_logprobs"][0]["logprob"], abs=1e-4)
               for c in content)  # greedy: each token is its position's likeliest


async def test_logprobs_out_of_range_are_refused(cluster):
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        for body, param in (({"logprobs": 21}, "logprobs"),
                            ({"logprobs": 21, "echo": True}, "logprobs")):
            response = await http.post("/v1/completions", json={
                "model": "tiny", "prompt": PROMPT, "max_tokens": 2, **body})
            assert response.status_code == 400 and response.json()["error"]["param"] == param
        chat = await http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
            "top_logprobs": 2})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "top_logprobs"


async def test_grpc_responses_carry_each_tokens_logprobs(cluster):
    import grpc

    from cascade.v1 import gateway_pb2, gateway_pb2_grpc

    tokenizer = cluster.target.tokenizer
    prompt_ids = tokenizer(PROMPT).input_ids
    reference = target_logprobs(cluster, prompt_ids,
                                expected_tokens(cluster, PROMPT, MAX_TOKENS))
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS,
                                              temperature=0, num_draft_tokens=3, logprobs=2)
        responses = [r async for r in stub.Generate(request, timeout=60)]
        with_bad = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=2, logprobs=21)
        try:
            [r async for r in stub.Generate(with_bad, timeout=60)]
            raise AssertionError("logprobs 21 was accepted")
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "logprobs" in error.details()
    scored = [lp for r in responses for lp in r.logprobs]
    assert all(len(r.logprobs) == len(r.token_ids) for r in responses)
    assert len(scored) == MAX_TOKENS
    assert [lp.logprob for lp in scored] == pytest.approx(
        reference.max(-1).values.tolist(), abs=1e-4)  # greedy: each is its row's maximum
    assert all(len(lp.top_ids) == 2 for lp in scored)
