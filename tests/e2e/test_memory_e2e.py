"""The speculation memory through the whole cluster (gateway, drafter and verifier pods, a real
Redis): a finished generation is shared through the stream and drafted from by the same API key
only; output stays exactly the target's greedy decoding; a new drafter warms from the stream,
which stays within its cap; a Redis outage on either side never fails a generation."""

import asyncio

import grpc
import pytest
import redis.asyncio as redis

from cascade.core.memory.suffix_index import SuffixIndex
from cascade.serving import memory_stream
from cascade.tools.redis_server import free_port
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from drafter_service.server import build_drafter
from gateway.sessions.assignment import OrchestratorSettings
from cluster_expectations import PROMPTS, expected_tokens

MAX_TOKENS = 24
SUFFIX = {"num_draft_tokens": 4, "draft_method": "suffix", "temperature": 0.0,
          "draft_schedule": "fixed"}


async def _generate(cluster, prompt: str, key: str = "", **fields
                    ) -> list[gateway_pb2.GenerateResponse]:
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS,
                                              **{**SUFFIX, **fields})
        stub = gateway_pb2_grpc.GatewayStub(channel)
        return [r async for r in stub.Generate(request, timeout=60, metadata=metadata)]


def _tokens(responses) -> list[int]:
    return [t for r in responses for t in r.token_ids]


async def _indexed(index: SuffixIndex, num: int, timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if index.num_sequences >= num:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the memory indexed {index.num_sequences} sequences, not {num}")


@pytest.mark.parametrize("schedule", ["fixed", "auto"])
async def test_a_keys_generations_draft_for_that_key_only(cluster_with, schedule):
    """Under "auto" the verifier decodes the first run alone (nothing is known of the method
    yet); the rerun's drafter notes its memory draft is ready and the verifier asks for it."""
    async with cluster_with(None, api_keys="key-a,key-b") as cluster:
        prompt = PROMPTS[0]
        expected = expected_tokens(cluster, prompt, MAX_TOKENS)
        first = await _generate(cluster, prompt, "key-a", draft_schedule=schedule)
        assert _tokens(first) == expected
        await _indexed(cluster.drafter_servicer.memory, 1)
        again = await _generate(cluster, prompt, "key-a", draft_schedule=schedule)
        other = await _generate(cluster, prompt, "key-b", draft_schedule=schedule)
        assert _tokens(again) == _tokens(other) == expected
        assert "memory" in {r.stats.draft_source for r in again}
        assert "memory" not in {r.stats.draft_source for r in other}
        assert len(again) < len(first)
        assert sum(r.stats.num_accepted for r in again) >= len(expected) - (4 if schedule == "fixed" else 8)


async def test_a_new_drafter_warms_from_the_capped_stream(cluster_with, tiny_runners):
    settings = OrchestratorSettings(memory_stream_len=3, memory=memory_stream.MemoryMode.SHARED)
    async with cluster_with(None, orchestrator=settings) as cluster:
        for prompt in PROMPTS[:5]:
            await _generate(cluster, prompt, num_draft_tokens=2, draft_method="model")
        await asyncio.sleep(0.2)  # appends run after the last round is sent
        assert await cluster.client.xlen(memory_stream.STREAM) == 3
        fresh = SuffixIndex()
        service, _ = build_drafter(tiny_runners[1], grace_s=0.5, memory=fresh,
                                   registry=cluster.client)
        await service.start()
        try:
            await _indexed(fresh, 3)
            assert fresh.num_sequences == 3
        finally:
            await service.drain()


async def test_a_redis_outage_on_either_side_does_not_fail_a_generation(cluster, monkeypatch):
    async def refused(*args, **kwargs):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(memory_stream, "append", refused)  # the gateway cannot share
    feed = cluster.services["drafter"].companions[0]
    await feed.stop()
    dead = redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=0.2)
    feed.client, feed.backoff_s = dead, 0.05  # nor the drafter read
    await feed.start()
    try:
        for prompt in PROMPTS[1:3]:
            for method in ("suffix", "suffix_then_model"):
                responses = await _generate(cluster, prompt, draft_method=method)
                assert _tokens(responses) == expected_tokens(cluster, prompt, MAX_TOKENS)
    finally:
        await feed.stop()
        await dead.aclose()


async def test_a_malformed_stream_entry_is_skipped_and_the_feed_goes_on(cluster):
    memory = cluster.drafter_servicer.memory
    await cluster.client.xadd(memory_stream.STREAM, {"garbage": "1"})
    await cluster.client.xadd(memory_stream.STREAM, {"scope": "tiny|key:x", "prompt_len": 1,
                                                     "tokens": b"\xff\xff"})  # not uint32s
    await memory_stream.append(cluster.client, "tiny|key:x", [1, 2, 3], [4, 5, 6])
    await _indexed(memory, 1)
    assert memory.candidates([9, 2, 3], "tiny|key:x").num == 1
