"""Admission control through the whole stack: a verifier whose KV budget is taken refuses new
sessions after a bounded wait, the gateway answers 429 with Retry-After (RESOURCE_EXHAUSTED on
gRPC), the sessions it admitted keep running, and memory comes back when they end."""

import asyncio
from contextlib import asynccontextmanager

import grpc
import httpx
import pytest

from cascade.protocol.settings import SamplingParams
from cascade.protocol.wire.convert import sampling_to_pb
from cascade.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from verifier_service.scheduler import VerifierSettings

BUDGET = 64
BODY = {"model": "tiny", "prompt": "def main():", "max_tokens": 24, "temperature": 0,
        "num_draft_tokens": 3}


@pytest.fixture
async def small_cluster(cluster_with):
    async with cluster_with(VerifierSettings(kv_tokens=BUDGET, admission_wait_s=0.3)) as cluster:
        yield cluster


@asynccontextmanager
async def holding_memory(cluster, positions: int):
    """A verifier session, opened directly, that reserves ``positions`` until it closes."""
    async with grpc.aio.insecure_channel(cluster.services["verifier"].address) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=60)
        prompt = [5] * (positions // 2)
        params = SamplingParams(max_new_tokens=positions - len(prompt))
        await call.write(verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(
            session_id="holder", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
            sampling=sampling_to_pb(params))))
        sessions = cluster.verifier_sessions
        while sessions.num_active == 0:
            await asyncio.sleep(0.01)
        try:
            yield call, prompt
        finally:
            call.cancel()
    while sessions.engine.store.reserved:
        await asyncio.sleep(0.01)


async def test_a_full_verifier_means_429_with_retry_after_and_resource_exhausted(small_cluster):
    async with holding_memory(small_cluster, BUDGET - 10) as (held, prompt):
        async with httpx.AsyncClient(base_url=small_cluster.http_url, timeout=30) as http:
            for stream in (False, True):
                response = await http.post("/v1/completions", json={**BODY, "stream": stream})
                assert response.status_code == 429, response.text
                assert int(response.headers["retry-after"]) >= 1
                assert "KV budget" in response.json()["error"]["message"]
        async with grpc.aio.insecure_channel(small_cluster.grpc_address) as channel:
            request = gateway_pb2.GenerateRequest(prompt="def main():", num_draft_tokens=3)
            request.max_tokens = 24
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [r async for r in gateway_pb2_grpc.GatewayStub(channel).Generate(request)]
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await held.write(verifier_pb2.VerifyRequest(block=verifier_pb2.DraftBlock(
            session_id="holder", epoch=1, round=0, base_len=len(prompt), tokens=[1, 2])))
        verdict = await held.read()  # the admitted session is still served
        assert not verdict.is_stale and verdict.committed_len > len(prompt)
    async with httpx.AsyncClient(base_url=small_cluster.http_url, timeout=30) as http:
        response = await http.post("/v1/completions", json=BODY)  # memory came back
    assert response.status_code == 200, response.text
    store = small_cluster.verifier_sessions.engine.store
    for _ in range(200):  # the verifier closes the session when its stream ends, just after
        if store.reserved == 0:
            break
        await asyncio.sleep(0.01)
    assert store.reserved == 0


async def test_a_session_waits_for_memory_within_the_admission_wait(cluster_with):
    async with cluster_with(VerifierSettings(kv_tokens=BUDGET, admission_wait_s=20)) as cluster:
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=30) as http:
            async with holding_memory(cluster, BUDGET - 10):
                waiting = asyncio.create_task(http.post("/v1/completions", json=BODY))
                await asyncio.sleep(0.5)
                assert not waiting.done()  # it waits for memory instead of failing
            response = await waiting
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 24


async def test_a_request_larger_than_the_whole_budget_is_refused_at_once(small_cluster):
    async with httpx.AsyncClient(base_url=small_cluster.http_url, timeout=30) as http:
        response = await http.post("/v1/completions", json={**BODY, "max_tokens": BUDGET})
    assert response.status_code == 429
    assert "whole KV budget" in response.json()["error"]["message"]


async def test_clients_that_go_away_mid_stream_give_their_memory_back(cluster_with):
    async with cluster_with(VerifierSettings(kv_tokens=4096)) as cluster:
        store = cluster.verifier_sessions.engine.store
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=30) as http:
            async def leave_after_first_chunk():
                body = {**BODY, "max_tokens": 200, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    async for _ in response.aiter_lines():
                        break  # the client disconnects mid-generation

            await asyncio.gather(*(leave_after_first_chunk() for _ in range(4)))
        for _ in range(500):
            if store.reserved == 0 and cluster.verifier_sessions.num_active == 0:
                break
            await asyncio.sleep(0.02)
        assert store.reserved == 0 and cluster.verifier_sessions.num_active == 0
