"""What a session is safe from, on a real cluster (Redis, gRPC pods, the gateway): other keys
(resume is for the key that started it), bursts and resumes around the per-key limits, a
client that stops reading, a stored session that is complete, lost epoch bumps, and a slow
reader of a long replay."""

import asyncio
import json

import grpc
import httpx
import pytest

from cascade.protocol.prefix_keys import BLOCK_SIZE
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.serving.channels import ChannelPool
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.sessions.assignment import OrchestratorSettings
from gateway.sessions.generation import GenerationRequest
from gateway.sessions.lease import ConsumerIdle
from gateway.sessions.orchestrator import Orchestrator
from gateway.sessions.session_store import LeaseHeld, SessionLost, SessionStore, session_keys

BODY = {"model": "tiny", "prompt": "def main():", "max_tokens": 120, "temperature": 0,
        "num_draft_tokens": 3}
KEYS = ("key-a", "key-b")


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def first_event_id(http: httpx.AsyncClient, key: str) -> str:
    """Start a stream as ``key``, read its first round's event, and leave (cancelled)."""
    async with http.stream("POST", "/v1/completions", json={**BODY, "stream": True},
                           headers=bearer(key)) as response:
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                return line[4:]
    raise AssertionError("no event id")


def event_text(body: str) -> str:
    return "".join(json.loads(line[6:])["choices"][0]["text"] for line in body.split("\n")
                   if line.startswith("data: {"))


async def test_only_the_key_that_started_a_session_may_resume_it(cluster_with):
    async with cluster_with(None, api_keys=",".join(KEYS)) as cluster:
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            whole = await http.post("/v1/completions", json=BODY, headers=bearer("key-a"))
            event_id = await first_event_id(http, "key-a")
            session = event_id.split(".")[0]
            path = f"/v1/sessions/{session}/events"
            stolen = await http.get(path, headers=bearer("key-b"))
            assert stolen.status_code == 404  # as for an id that does not exist
            assert stolen.json()["error"]["code"] == "session_not_found"
            owned = await http.get(path, headers=bearer("key-a"))
            assert owned.status_code == 200
            assert event_text(owned.text) == whole.json()["choices"][0]["text"]
        channel = grpc.aio.insecure_channel(cluster.grpc_address)
        stub = gateway_pb2_grpc.GatewayStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Resume(gateway_pb2.ResumeRequest(session_id=session),
                                       metadata=(("authorization", "Bearer key-b"),)):
                pass
        assert refused.value.code() is grpc.StatusCode.NOT_FOUND
        await channel.close()


async def test_http_grpc_and_resumed_streams_share_a_keys_limit(cluster_with):
    """One limiter per gateway: a key at its one session cannot start another over gRPC, and a
    stream it left and resumed holds its slot like a new one."""
    async with cluster_with(None, api_keys=",".join(KEYS), max_sessions_per_key=1) as cluster:
        channel = grpc.aio.insecure_channel(cluster.grpc_address)
        stub = gateway_pb2_grpc.GatewayStub(channel)
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            event_id = await first_event_id(http, "key-a")
            await asyncio.sleep(0.3)  # the left stream is closed, its slot given back
            async with http.stream("GET", f"/v1/sessions/{event_id.split('.')[0]}/events",
                                   headers=bearer("key-a")) as resumed:
                assert resumed.status_code == 200
                again = await http.post("/v1/completions", json=BODY, headers=bearer("key-a"))
                assert again.status_code == 429
                with pytest.raises(grpc.aio.AioRpcError) as over:
                    async for _ in stub.Generate(gateway_pb2.GenerateRequest(prompt="x"),
                                                 metadata=(("authorization", "Bearer key-a"),)):
                        pass
                assert over.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                await resumed.aread()
            assert (await http.post("/v1/completions", json=BODY,
                                    headers=bearer("key-a"))).status_code == 200
        await channel.close()


def orchestrator_for(cluster, lease_s: float = 10.0, **settings) -> Orchestrator:
    store = SessionStore(cluster.client, lease_s=lease_s)
    return Orchestrator(cluster.client, store, ChannelPool(), OrchestratorSettings(**settings))


def request(max_new_tokens: int = 60) -> GenerationRequest:
    return GenerationRequest([5, 6, 7, 8], SamplingParams(max_new_tokens=max_new_tokens),
                             DraftConfig(3))


async def test_a_consumer_that_stops_reading_gives_its_session_up(cluster):
    """No round taken for idle_timeout_s: the session is recorded cancelled (resumable), its
    pods' work is cancelled (the verifier frees its KV), and the late consumer hears why."""
    orchestrator = orchestrator_for(cluster, lease_s=0.6, idle_timeout_s=0.5)
    chunks = orchestrator.generate(request(200))
    first = await anext(chunks)
    await asyncio.sleep(1.5)  # the client stopped reading
    record = await cluster.client.hgetall(session_keys(first.session_id)[0])
    assert record[b"status"] == b"cancelled"
    assert cluster.verifier_sessions.num_active == 0
    with pytest.raises(ConsumerIdle):
        async for _ in chunks:
            pass


async def test_a_stored_complete_session_resumes_to_its_end_and_no_further(cluster):
    """A gateway died between storing the final round and recording it finished (the old
    two-step ending): resume replays the rounds with their finish reason and runs nothing."""
    orchestrator = orchestrator_for(cluster, lease_s=0.2)
    store, wanted = orchestrator.store, request(6)
    sid = (await store.create(wanted, "", "nowhere:1")).session_id
    await store.append(sid, 1, 0, [9, 9, 9, 9])
    await store.append(sid, 1, 4, [9, 9])  # six tokens: complete, but still "running"
    await asyncio.sleep(0.3)  # its gateway's lease lapses
    _, chunks = await orchestrator.resume(sid, "")
    got = [chunk async for chunk in chunks]
    assert [len(c.token_ids) for c in got] == [4, 2]
    assert got[-1].finish_reason.value == "length"
    record = await store.record(sid)
    assert record["status"] == "finished" and record["finish_reason"] == "length"


async def test_a_resume_past_the_stored_rounds_is_refused_as_data_loss(cluster):
    """The client has more rounds than Redis kept (a failover without WAIT lost them): the
    continuation would not line up with its text, so the resume says so instead of running."""
    from gateway.sessions.generation import RoundsLost

    orchestrator = orchestrator_for(cluster, lease_s=0.2)
    store = orchestrator.store
    sid = (await store.create(request(12), "", "nowhere:1")).session_id
    await store.append(sid, 1, 0, [9, 9])
    await store.append(sid, 1, 2, [9])
    await asyncio.sleep(0.3)
    with pytest.raises(RoundsLost, match="fewer stored rounds than the 3"):
        await orchestrator.resume(sid, "", after_round=3)
    _, chunks = await orchestrator.resume(sid, "", after_round=2)  # what is stored: fine
    await chunks.aclose()


async def test_a_lost_epoch_bump_is_written_back_and_the_stream_goes_on(cluster):
    orchestrator = orchestrator_for(cluster)
    whole = [t async for c in orchestrator.generate(request()) for t in c.token_ids]
    chunks = orchestrator.generate(request())
    first = await anext(chunks)
    key = session_keys(first.session_id)[0]
    await cluster.client.hset(key, "epoch", 0)  # a Redis restart lost the epoch's last bump
    rest = [t async for c in chunks for t in c.token_ids]
    assert first.token_ids + rest == whole
    record = await cluster.client.hgetall(key)
    assert record[b"epoch"] == b"1" and record[b"status"] == b"finished"


async def test_a_slow_reader_of_a_long_replay_keeps_the_lease(cluster):
    orchestrator = orchestrator_for(cluster, lease_s=0.6)
    other = SessionStore(cluster.client, lease_s=0.6, owner="other-gateway")
    chunks = orchestrator.generate(request(120))
    sid = (await anext(chunks)).session_id
    for _ in range(5):
        await anext(chunks)
    await chunks.aclose()  # the client left: cancelled, resumable at once
    _, resumed = await orchestrator.resume(sid, "")
    await anext(resumed)
    for _ in range(3):  # reads a replayed round every 0.5 s: the lease (0.6 s) must be renewed
        await asyncio.sleep(0.5)
        with pytest.raises(LeaseHeld):
            await other.takeover(sid)
        await anext(resumed)
    await resumed.aclose()


async def test_resume_by_another_caller_is_unknown(cluster):
    orchestrator = orchestrator_for(cluster)
    owned = GenerationRequest([5, 6], SamplingParams(max_new_tokens=4), caller="digest-a")
    sid = (await anext(orchestrator.generate(owned))).session_id
    with pytest.raises(SessionLost):
        await orchestrator.resume(sid, "digest-b")


async def test_two_keys_with_the_same_prompt_share_no_prefix(cluster_with):
    """While key A's session is live on the pods, key B's session of the same prompt computes
    it (a copy would make B's first token come sooner: the timing of a guess would tell B
    A's prompt); a second session of key A copies it. Pods and gateway as deployed (the
    drafter's caches follow the same scopes: tests/core/kv/test_prefix_share.py)."""
    prompt = "the secret system prompt of one tenant, long enough to be worth sharing " * 3
    body = {**BODY, "prompt": prompt, "max_tokens": 200, "ignore_eos": True}
    async with cluster_with(None, api_keys=",".join(KEYS)) as cluster:
        engine = cluster.verifier_sessions.engine
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            async with http.stream("POST", "/v1/completions", json={**body, "stream": True},
                                   headers=bearer("key-a")) as live:
                lines = live.aiter_lines()
                while not (await anext(lines)).startswith("id: "):
                    pass  # key A's session is live, its prompt held on both pods
                short = {**body, "max_tokens": 2}
                other = await http.post("/v1/completions", json=short, headers=bearer("key-b"))
                assert other.status_code == 200, other.text
                assert engine.prefixes.shared_tokens == 0
                same = await http.post("/v1/completions", json=short, headers=bearer("key-a"))
                assert same.status_code == 200, same.text
                assert engine.prefixes.shared_tokens > 0


async def test_two_keys_never_take_each_others_ended_prompt_blocks(cluster_with):
    """Key A's ended request leaves its prompt's full KV blocks cached on the verifier; key B's
    request of the same prompt computes it (the hit counters stay at zero, so its first token
    is no sooner), and key A's next request takes them."""
    prompt = "the secret system prompt of one tenant, long enough to fill whole KV blocks " * 8
    short = {**BODY, "prompt": prompt, "max_tokens": 2}
    async with cluster_with(None, api_keys=",".join(KEYS)) as cluster:
        prefixes = cluster.verifier_sessions.engine.prefixes
        async with httpx.AsyncClient(base_url=cluster.http_url, timeout=60) as http:
            first = await http.post("/v1/completions", json=short, headers=bearer("key-a"))
            assert first.status_code == 200, first.text
            assert prefixes.shared_tokens == 0
            queried = prefixes.queried_tokens
            other = await http.post("/v1/completions", json=short, headers=bearer("key-b"))
            assert other.status_code == 200, other.text
            assert prefixes.queried_tokens > queried and prefixes.shared_tokens == 0
            again = await http.post("/v1/completions", json=short, headers=bearer("key-a"))
            assert again.status_code == 200, again.text
            assert prefixes.shared_tokens >= BLOCK_SIZE
            assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
