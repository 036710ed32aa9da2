"""Token trees through the whole cluster (gateway, drafter and verifier pods, Redis): greedy trees
equal the target's greedy decoding (alone, batched with chains, after the drafter dies), a
seeded keyed request gives the same text with k = 0, chains and trees, rounds name the branch
taken, and requests that cannot draft trees are refused naming the field."""

import asyncio
import json

import grpc
import httpx

from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from drafter_service.server import build_drafter
from cluster_expectations import MAX_TOKENS, PROMPTS, expected_tokens

from conftest import _start_pod

TREE = {"num_draft_tokens": 3, "draft_tree_nodes": 12, "draft_tree_branching": 3,
        "draft_method": "model"}  # the drafter model's trees (auto may draft from its lookup)


async def _complete(http: httpx.AsyncClient, prompt: str, **fields) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, **fields}
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_greedy_trees_alone_and_batched_with_chains_equal_target_greedy(cluster):
    """Fixed and auto schedules (auto verifies the best-first prefix of each tree that pays)."""
    tokenizer = cluster.target.tokenizer
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        trees = [_complete(http, p, temperature=0, **{**TREE, "draft_method": (
                               "model", "ngram", "ngram_then_model")[i % 3]},
                           draft_schedule=("fixed", "auto")[i % 2])
                 for i, p in enumerate(PROMPTS)]
        chains = [_complete(http, p, temperature=0, num_draft_tokens=2) for p in PROMPTS]
        results = await asyncio.gather(*trees, *chains)  # one verifier batches them together
    for prompt, result in zip(PROMPTS * 2, results):
        expected = tokenizer.decode(expected_tokens(cluster, prompt), skip_special_tokens=True)
        assert result["choices"][0]["text"] == expected


async def test_confident_trees_equal_target_greedy_and_are_checked(cluster):
    """CAPE's confidence-aware trees on both APIs; a bad expansion, or one the recursive rule
    cannot use, is refused naming the field."""
    tokenizer = cluster.target.tokenizer
    cape = {**TREE, "draft_tree_expansion": "confidence", "draft_schedule": "fixed"}
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        results = await asyncio.gather(*[_complete(http, p, temperature=0, **cape)
                                         for p in PROMPTS])
        for fields in ({"draft_tree_expansion": "wide"},
                       {"draft_tree_expansion": "confidence", "acceptance": "recursive",
                        "temperature": 0.8}):
            body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "draft_tree_nodes": 8,
                    **fields}
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "draft_tree_expansion"
    for prompt, result in zip(PROMPTS, results):
        expected = tokenizer.decode(expected_tokens(cluster, prompt), skip_special_tokens=True)
        assert result["choices"][0]["text"] == expected
    responses = await _grpc_tokens(cluster, "def main():", temperature=0, **cape)
    assert max(r.stats.num_drafted for r in responses) > TREE["num_draft_tokens"]  # trees, not chains


async def _grpc_tokens(cluster, prompt: str, **fields) -> list[gateway_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=24, **fields)
        return [r async for r in gateway_pb2_grpc.GatewayStub(channel).Generate(request,
                                                                                 timeout=60)]


async def test_a_seeded_keyed_request_gives_one_text_with_k0_chains_and_trees(cluster):
    sampled = dict(temperature=0.9, seed=1234, acceptance="keyed")
    texts = []
    for draft in ({"num_draft_tokens": 0}, {"num_draft_tokens": 4},
                  {"num_draft_tokens": 3, "draft_tree_nodes": 10}):
        responses = await _grpc_tokens(cluster, "The quick brown fox", **sampled, **draft)
        texts.append([t for r in responses for t in r.token_ids])
    assert texts[0] == texts[1] == texts[2] and len(texts[0]) > 4
    other = await _grpc_tokens(cluster, "The quick brown fox", num_draft_tokens=3,
                               draft_tree_nodes=10, **{**sampled, "seed": 99})
    assert [t for r in other for t in r.token_ids] != texts[0]


async def test_tree_rounds_name_the_branch_taken(cluster):
    responses = await _grpc_tokens(cluster, "def main():", temperature=0, **TREE,
                                   draft_schedule="fixed")
    drafted = [r for r in responses if r.drafted_parents]
    assert drafted, "every drafting round of a tree request carries its nodes"
    for r in drafted:
        assert len(r.drafted_parents) == len(r.drafted_tokens) == r.stats.num_drafted
        assert len(r.path) == r.stats.num_accepted
        assert [r.drafted_tokens[n] for n in r.path] == list(r.token_ids[: r.stats.num_accepted])
        for parent, child in zip([-1, *r.path], r.path):  # each node's parent is the previous
            assert r.drafted_parents[child] == parent
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        body = {"model": "tiny", "prompt": "def main():", "max_tokens": 8, "temperature": 0,
                "stream": True, "cascade_rounds": True, "draft_schedule": "fixed", **TREE}
        response = await http.post("/v1/completions", json=body)
    rounds = [json.loads(line[6:])["cascade"] for line in response.text.splitlines()
              if line.startswith("data: {") and '"cascade"' in line]
    assert any(r.get("parents") for r in rounds)
    assert all(len(r["path"]) == r["num_accepted"] for r in rounds if r.get("parents"))


async def test_requests_that_cannot_draft_trees_are_refused_naming_the_field(cluster):
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        for fields in ({"acceptance": "cascade"}, {"draft_schedule": "adaptive"}):
            body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "draft_tree_nodes": 8,
                    **fields}
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "draft_tree_nodes"
        body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "draft_tree_nodes": 65}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == 400 and "draft_tree_nodes" in response.text
        body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "draft_tree_branching": 17}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "draft_tree_branching"


async def test_a_tree_session_moves_when_its_drafter_dies_and_stays_exact(cluster, tiny_runners):
    spare, spare_servicer = build_drafter(tiny_runners[1], grace_s=1.0)
    spare = await _start_pod(spare, "drafter", cluster.client,
                             lambda: 1 + spare_servicer.num_active)
    prompt, max_tokens = "class Config:", 40
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens,
                                              temperature=0, num_draft_tokens=3,
                                              draft_tree_nodes=12)
        stream = gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=60)
        first = await stream.read()
        victim = cluster.services["drafter"]
        await victim.heartbeat.stop()
        await victim.server.stop(0)
        rest = []
        while (response := await stream.read()) is not grpc.aio.EOF:
            rest.append(response)
    assert [t for r in [first, *rest] for t in r.token_ids] == expected_tokens(
        cluster, prompt, max_tokens)
    await spare.drain()


async def test_recursive_sampled_trees_run_through_the_services(cluster):
    responses = await _grpc_tokens(cluster, "def main():", temperature=0.8, seed=3,
                                   acceptance="recursive", num_draft_tokens=3,
                                   draft_tree_nodes=9, draft_schedule="fixed")
    tokens = [t for r in responses for t in r.token_ids]
    assert len(tokens) == 24 or responses[-1].finish_reason == 1  # length, or a stop token
    trees = [r for r in responses if r.drafted_parents]
    assert trees and all(len(r.path) == r.stats.num_accepted for r in trees)
    async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "temperature": 0.8,
                "acceptance": "recursive", "draft_method": "ngram"}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == "acceptance"
