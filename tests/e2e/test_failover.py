"""A drafter dies mid-generation: the session moves, nothing is lost or repeated."""

import grpc

from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from drafter_service.server import build_drafter
from test_gateway_e2e import expected_tokens

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
