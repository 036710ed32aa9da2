"""A drafter dies mid-generation: the session moves, nothing is lost or repeated."""

import grpc

from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from drafter_service.server import build_drafter
from cluster_expectations import expected_tokens

from conftest import _start_pod


async def test_drafter_killed_mid_stream_session_moves_and_output_is_exact(cluster, tiny_runners):
    _, drafter_model = tiny_runners
    spare, spare_servicer = build_drafter(drafter_model, grace_s=1.0)
    spare = await _start_pod(spare, "drafter", cluster.client, lambda: 1 + spare_servicer.num_active)
    prompt, max_tokens = "def main():", 40
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(prompt=prompt, num_draft_tokens=1, temperature=0)
        request.max_tokens = max_tokens
        stream = stub.Generate(request, timeout=60)
        first = await stream.read()
        victim = cluster.services["drafter"]
        await victim.heartbeat.stop()
        await victim.server.stop(0)  # dies: in-flight streams are cut, no drain
        rest = []
        while (response := await stream.read()) is not grpc.aio.EOF:
            rest.append(response)
    tokens = [t for r in [first, *rest] for t in r.token_ids]
    expected = expected_tokens(cluster, prompt, max_tokens)
    assert tokens == expected
    record = await cluster.client.hgetall(f"cascade:session:{{{first.session_id}}}")
    assert record[b"epoch"] == b"2" and record[b"drafter"].decode() == spare.address
    stored = await cluster.client.lrange(f"cascade:session:{{{first.session_id}}}:tokens", 0, -1)
    assert [int(t) for t in stored] == expected
    await spare.drain()


async def test_a_hung_drafter_costs_one_round_timeout_and_output_is_exact(
        cluster_with, tiny_runners, monkeypatch):
    """The drafter's model thread blocks mid-generation while its health and heartbeat stay
    fine: the gateway gives up on the round after the round timeout, cools the pods down, and
    the session finishes on the verifier alone (the only drafter is cooling), exactly."""
    import asyncio
    import threading
    import time

    from gateway.sessions.orchestrator import OrchestratorSettings

    _, drafter_model = tiny_runners
    hang, release = threading.Event(), threading.Event()
    forward = drafter_model.model.forward

    def maybe_hang(*args, **kwargs):
        if hang.is_set():
            release.wait(30)
        return forward(*args, **kwargs)

    monkeypatch.setattr(drafter_model.model, "forward", maybe_hang)
    settings = OrchestratorSettings(first_round_timeout_s=30, round_timeout_s=1.0,
                                    round_timeout_factor=1.0, cooldown_s=60)
    prompt, max_tokens = "def main():", 30
    try:
        async with cluster_with(None, settings) as cluster, \
                grpc.aio.insecure_channel(cluster.grpc_address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(prompt=prompt, num_draft_tokens=2,
                                                  temperature=0, max_tokens=max_tokens)
            stream = stub.Generate(request, timeout=60)
            first = await stream.read()
            hang.set()
            started = time.monotonic()
            rest = []
            while (response := await stream.read()) is not grpc.aio.EOF:
                rest.append(response)
            recovered_after = time.monotonic() - started
            expected = expected_tokens(cluster, prompt, max_tokens)
    finally:
        release.set()
        await asyncio.sleep(0)
    tokens = [t for r in [first, *rest] for t in r.token_ids]
    assert tokens == expected
    assert rest and all(r.stats.num_drafted == 0 for r in rest[-3:])  # the verifier decoded alone
    assert recovered_after < 10
