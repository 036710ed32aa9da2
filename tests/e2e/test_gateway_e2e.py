"""Through the gateway's HTTP API: output equals the target's plain greedy decoding."""

import json

import grpc
import httpx
import openai
import pytest
import torch

from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from cluster_expectations import (MAX_TOKENS, PROMPTS, clear_sessions, expected_tokens,
                                  penalized_greedy, stored_tokens)
from models import hf_greedy


@pytest.mark.parametrize("k", [1, 4])
async def test_http_greedy_equals_target_greedy(cluster, k):
    tokenizer = cluster.target.tokenizer
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        for prompt in PROMPTS:
            await clear_sessions(cluster)
            body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "num_draft_tokens": k}
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            expected = expected_tokens(cluster, prompt)
            choice = response.json()["choices"][0]
            assert choice["text"] == tokenizer.decode(expected, skip_special_tokens=True)
            assert await stored_tokens(cluster) == [expected]  # Redis holds what was sent
            assert response.json()["usage"]["completion_tokens"] == len(expected)


async def test_openai_client_streaming_matches_non_streaming(cluster):
    client = openai.AsyncOpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused")
    args = dict(model="tiny", prompt="def main():", max_tokens=MAX_TOKENS, temperature=0)
    full = await client.completions.create(**args)
    chunks = [c async for c in await client.completions.create(stream=True, **args)]
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}
    await client.close()


async def test_grpc_generate_reports_accepted_tokens(cluster):
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(prompt="import os\n", num_draft_tokens=3,
                                              temperature=0)
        request.max_tokens = MAX_TOKENS
        responses = [r async for r in stub.Generate(request, timeout=60)]
    tokens = [t for r in responses for t in r.token_ids]
    assert tokens == expected_tokens(cluster, "import os\n")
    assert all(r.stats.num_accepted < len(r.token_ids) for r in responses)
    assert responses[-1].finish_reason != 0 and responses[-1].completion_tokens == len(tokens)


async def test_no_drafter_alive_falls_back_to_verifier(cluster):
    await cluster.services["drafter"].drain()
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        body = {"model": "tiny", "prompt": "class Config:", "max_tokens": MAX_TOKENS,
                "temperature": 0}
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    expected = expected_tokens(cluster, "class Config:")
    assert response.json()["choices"][0]["text"] == cluster.target.tokenizer.decode(
        expected, skip_special_tokens=True)


async def test_ngram_drafting_through_http_is_exact(cluster):
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        for method in ("ngram", "ngram_then_model"):
            body = {"model": "tiny", "prompt": "x = [1, 2,", "max_tokens": MAX_TOKENS,
                    "temperature": 0, "draft_method": method}
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            expected = expected_tokens(cluster, "x = [1, 2,")
            assert response.json()["choices"][0]["text"] == cluster.target.tokenizer.decode(
                expected, skip_special_tokens=True)
        bad = await http.post("/v1/completions", json={**body, "draft_method": "telepathy"})
        assert bad.status_code == 400 and "draft_method" in bad.text


async def test_a_speculative_cascade_through_http(cluster):
    """Chow at alpha 0 (greedy) is the target's greedy output; a lenient alpha keeps more of
    the drafter's tokens per round; the usage reports the deferred positions."""
    prompt = "def main():"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "num_draft_tokens": 3, "acceptance": "cascade", "cascade_rule": "chow"}
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        strict = (await http.post("/v1/completions", json={**body, "cascade_alpha": 0.0})).json()
        lenient = (await http.post("/v1/completions", json={**body, "cascade_alpha": 1.0})).json()
        lossless = (await http.post("/v1/completions", json={**body,
                                                             "acceptance": "lossless"})).json()
    expected = cluster.target.tokenizer.decode(expected_tokens(cluster, prompt),
                                               skip_special_tokens=True)
    assert strict["choices"][0]["text"] == expected
    assert strict["usage"]["num_deferred_tokens"] > 0
    assert lenient["usage"]["num_deferred_tokens"] == 0
    assert "num_deferred_tokens" not in lossless["usage"]
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        rounds = {}
        for alpha in (0.0, 1.0):
            request = gateway_pb2.GenerateRequest(
                prompt=prompt, num_draft_tokens=3, temperature=0, max_tokens=MAX_TOKENS,
                acceptance="cascade", cascade_rule="chow", cascade_alpha=alpha)
            rounds[alpha] = [r async for r in stub.Generate(request, timeout=60)]
    assert len(rounds[1.0]) < len(rounds[0.0])  # more tokens per round
    assert sum(r.stats.num_deferred for r in rounds[0.0]) == strict["usage"]["num_deferred_tokens"]


async def test_adaptive_draft_length_through_grpc_is_exact(cluster):
    """The tiny pair's drafter is random, so the schedule shrinks k from 3 towards 1, and the
    greedy output stays the target's own."""
    prompt = "The quick brown fox"
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(prompt=prompt, num_draft_tokens=3, temperature=0,
                                              max_tokens=24, draft_schedule="adaptive")
        responses = [r async for r in stub.Generate(request, timeout=60)]
    tokens = [t for r in responses for t in r.token_ids]
    assert tokens == expected_tokens(cluster, prompt, 24)
    drafted = [r.stats.num_drafted for r in responses]
    assert drafted[0] == 3 and len(set(drafted)) > 1, drafted


async def test_a_batch_of_prompts_with_n_choices_each_equals_target_greedy(cluster):
    """Four sessions from one request (two prompts, n = 2), greedy: every choice is its
    prompt's greedy text, streamed or not."""
    tokenizer = cluster.target.tokenizer
    prompts = PROMPTS[:2]
    expected = [tokenizer.decode(expected_tokens(cluster, p), skip_special_tokens=True)
                for p in prompts for _ in range(2)]
    body = {"model": "tiny", "prompt": prompts, "max_tokens": MAX_TOKENS, "temperature": 0,
            "num_draft_tokens": 3, "n": 2}
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        whole = (await http.post("/v1/completions", json=body)).json()
        streamed = ["", "", "", ""]
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        streamed[choice["index"]] += choice["text"]
    assert [c["text"] for c in whole["choices"]] == expected == streamed


async def test_stop_token_ids_end_the_greedy_text_at_their_first_occurrence(cluster):
    expected = expected_tokens(cluster, PROMPTS[0])
    stop = expected[4]
    cut = expected[:expected.index(stop) + 1]
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0,
            "num_draft_tokens": 4, "stop_token_ids": [stop]}
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        result = (await http.post("/v1/completions", json=body)).json()
    assert result["usage"]["completion_tokens"] == len(cut)
    assert result["choices"][0]["finish_reason"] == "stop"
    assert await stored_tokens(cluster) == [cut]


async def test_min_tokens_is_the_targets_decoding_with_early_stops_forbidden(cluster):
    """The reference: transformers' greedy decoding with the stop token suppressed for the
    first min_tokens tokens (its min_new_tokens), the stop token ending it after."""
    tokenizer = cluster.target.tokenizer
    prompt_ids = tokenizer(PROMPTS[1]).input_ids
    stop = expected_tokens(cluster, PROMPTS[1])[1]
    reference = hf_greedy(cluster.target, prompt_ids, MAX_TOKENS, min_new_tokens=6,
                          eos_token_id=stop)
    reference = reference[:reference.index(stop) + 1] if stop in reference[6:] else reference
    for draft in ({"num_draft_tokens": 0}, {"num_draft_tokens": 4},
                  {"num_draft_tokens": 3, "draft_tree_nodes": 8}):
        body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS,
                "temperature": 0, "stop_token_ids": [stop], "min_tokens": 6,
                "draft_schedule": "fixed", **draft}
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            result = (await http.post("/v1/completions", json=body)).json()
        assert result["choices"][0]["text"] == tokenizer.decode(reference,
                                                                skip_special_tokens=True)
        assert result["usage"]["completion_tokens"] == len(reference)


async def test_logit_bias_is_the_targets_decoding_with_the_same_bias(cluster):
    """The reference: transformers' greedy decoding with the same bias on the token (its
    sequence_bias); -100 on the token greedy decoding would pick first."""
    tokenizer = cluster.target.tokenizer
    prompt_ids = tokenizer(PROMPTS[2]).input_ids
    banned = expected_tokens(cluster, PROMPTS[2])[0]
    reference = hf_greedy(cluster.target, prompt_ids, MAX_TOKENS,
                          sequence_bias={(banned,): -100.0})
    assert banned not in reference
    for draft in ({"num_draft_tokens": 0}, {"num_draft_tokens": 4},
                  {"num_draft_tokens": 3, "draft_tree_nodes": 8}):
        body = {"model": "tiny", "prompt": PROMPTS[2], "max_tokens": MAX_TOKENS,
                "temperature": 0, "logit_bias": {str(banned): -100},
                "draft_schedule": "fixed", **draft}
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            result = (await http.post("/v1/completions", json=body)).json()
        assert await stored_tokens(cluster) == [reference]
        await clear_sessions(cluster)
        assert result["usage"]["completion_tokens"] == len(reference)


async def test_penalties_are_the_targets_decoding_with_the_same_penalties(cluster):
    """Each position's penalties count the drafted tokens before it: greedy output equals the
    slow reference for target-alone, chains and trees."""
    tokenizer = cluster.target.tokenizer
    prompt_ids = tokenizer(PROMPTS[3]).input_ids
    penalties = {"presence_penalty": 0.5, "frequency_penalty": 0.75,
                 "repetition_penalty": 1.3}
    reference = penalized_greedy(cluster, prompt_ids, MAX_TOKENS, 0.5, 0.75, 1.3)
    assert reference != expected_tokens(cluster, PROMPTS[3])  # the penalties change the text
    for draft in ({"num_draft_tokens": 0}, {"num_draft_tokens": 4},
                  {"num_draft_tokens": 3, "draft_tree_nodes": 8}):
        body = {"model": "tiny", "prompt": PROMPTS[3], "max_tokens": MAX_TOKENS,
                "temperature": 0, "draft_schedule": "fixed", **penalties, **draft}
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            response = await http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert await stored_tokens(cluster) == [reference], draft
        await clear_sessions(cluster)


async def test_bad_words_are_never_generated_and_the_rest_is_the_targets(cluster):
    """A two-token bad word taken from the greedy text: the output is a slow reference's (the
    target's greedy decoding with the word's last token banned wherever the rest precedes
    it), for target-alone, chains and trees, and never holds the word's tokens in a row."""
    tokenizer = cluster.target.tokenizer
    prompt_ids = tokenizer(PROMPTS[4]).input_ids
    greedy = expected_tokens(cluster, PROMPTS[4])
    word = tokenizer.decode(greedy[2:4])
    sequences = {tuple(tokenizer(t, add_special_tokens=False).input_ids)
                 for t in (word, " " + word)} - {()}
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = cluster.target.model(torch.tensor([prompt_ids + generated])).logits[0, -1]
            for seq in sequences:
                if len(seq) == 1 or tuple(generated[len(generated) - len(seq) + 1:]) == seq[:-1]:
                    logits[seq[-1]] = float("-inf")
            generated.append(int(logits.argmax()))
    assert generated != greedy[:MAX_TOKENS]
    for draft in ({"num_draft_tokens": 0}, {"num_draft_tokens": 4},
                  {"num_draft_tokens": 3, "draft_tree_nodes": 8}):
        body = {"model": "tiny", "prompt": PROMPTS[4], "max_tokens": MAX_TOKENS,
                "temperature": 0, "draft_schedule": "fixed", "bad_words": [word], **draft}
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            response = await http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert await stored_tokens(cluster) == [generated], draft
        await clear_sessions(cluster)


async def test_best_of_returns_the_candidates_with_the_highest_target_logprob(cluster):
    """best_of 3, n 2: the two of the three seeded candidates (the same texts n = 3 gives:
    keyed sampling depends on the prompt and seed alone) whose tokens the target scores
    highest, best first; every candidate is counted in usage."""
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 1.0,
            "seed": 7, "acceptance": "keyed", "num_draft_tokens": 3}
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        every = (await http.post("/v1/completions", json={**body, "n": 3, "logprobs": 0})).json()
        best = await http.post("/v1/completions", json={**body, "n": 2, "best_of": 3})
        refused = [await http.post("/v1/completions", json={**body, **extra})
                   for extra in ({"n": 2, "best_of": 1}, {"best_of": 2, "stream": True})]
    assert best.status_code == 200, best.text
    totals = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in every["choices"]}
    ranked = sorted(totals, key=totals.get, reverse=True)
    assert len(set(totals)) == 3, "the seeds should give three different texts"
    result = best.json()
    assert [c["text"] for c in result["choices"]] == ranked[:2]
    assert [c["index"] for c in result["choices"]] == [0, 1]
    assert all(c["logprobs"] is None for c in result["choices"])  # not asked for
    assert result["usage"]["completion_tokens"] == every["usage"]["completion_tokens"]
    for response in refused:
        assert response.status_code == 400 and response.json()["error"]["param"] == "best_of"


async def test_the_choices_of_a_prompt_compute_it_once(cluster):
    """n = 3 greedy: the verifier feeds the prompt for one choice and copies its keys and
    values for the other two, and every choice is still the target's greedy text."""
    tokenizer = cluster.target.tokenizer
    prompt = " ".join(PROMPTS)
    prompt_len = len(tokenizer(prompt).input_ids)
    expected = tokenizer.decode(expected_tokens(cluster, prompt), skip_special_tokens=True)
    prefixes = cluster.verifier_sessions.engine.prefixes
    before = prefixes.shared_tokens
    client = openai.AsyncOpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused")
    result = await client.completions.create(model="tiny", prompt=prompt, n=3, temperature=0,
                                             max_tokens=MAX_TOKENS,
                                             extra_body={"num_draft_tokens": 3})
    assert [c.text for c in result.choices] == [expected] * 3
    assert prefixes.shared_tokens - before == 2 * (prompt_len - 1)
