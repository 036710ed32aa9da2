"""The pod registry on a real Redis: one hash per role, expiry on Redis's clock, malformed
entries skipped, random tie-breaks, and pods that start while Redis is down."""

import asyncio
import json
import logging

import redis.asyncio as redis

from cascade.serving.registry import Heartbeat, least_loaded, live_pods, role_key
from cascade.tools.redis_server import RedisServer, free_port


async def test_least_loaded_pod_wins_and_equals_share_the_picks(redis_client):
    beats = [Heartbeat(redis_client, "verifier", f"10.0.0.{i}:1", lambda i=i: [3, 1, 1][i])
             for i in range(3)]
    for beat in beats:
        await beat.start()
    pods = await live_pods(redis_client, "verifier")
    assert sorted((p.address, p.load) for p in pods) == [("10.0.0.0:1", 3), ("10.0.0.1:1", 1),
                                                        ("10.0.0.2:1", 1)]
    picks = {await least_loaded(redis_client, "verifier") for _ in range(40)}
    assert picks == {"10.0.0.1:1", "10.0.0.2:1"}  # both tied pods get picked, never the busy one
    assert await least_loaded(redis_client, "verifier", {"10.0.0.1:1", "10.0.0.2:1"}) == "10.0.0.0:1"
    for beat in beats:
        await beat.stop()
    assert await live_pods(redis_client, "verifier") == []


async def test_a_pod_that_stops_beating_expires_and_is_removed(redis_client):
    beat = Heartbeat(redis_client, "drafter", "10.0.0.9:1", lambda: 0, interval_s=60, ttl_s=0.2)
    await beat.start()
    assert [p.address for p in await live_pods(redis_client, "drafter")] == ["10.0.0.9:1"]
    await asyncio.sleep(0.3)
    assert await live_pods(redis_client, "drafter") == []
    assert await redis_client.hlen(role_key("drafter")) == 0  # the reader cleaned it up
    beat._task.cancel()


async def test_a_malformed_entry_is_skipped_and_logged(redis_client, caplog):
    await redis_client.hset(role_key("verifier"), "bad:1", "not json")
    await redis_client.hset(role_key("verifier"), "bad:2", json.dumps({"load": "x"}))
    beat = Heartbeat(redis_client, "verifier", "10.0.0.5:1", lambda: 2)
    await beat.start()
    with caplog.at_level(logging.WARNING):
        assert await least_loaded(redis_client, "verifier") == "10.0.0.5:1"
    assert "bad:1" in caplog.text and "bad:2" in caplog.text
    await beat.stop()


async def test_a_pod_started_while_redis_is_down_registers_when_it_returns(tmp_path):
    port = free_port()
    client = redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.2)
    beat = Heartbeat(client, "verifier", "10.0.0.7:1", lambda: 0, interval_s=0.05)
    await beat.start()  # Redis is not running: no error, the pod keeps trying
    server = RedisServer(tmp_path, port=port).start()
    try:
        for _ in range(100):
            if await live_pods(client, "verifier"):
                break
            await asyncio.sleep(0.05)
        assert [p.address for p in await live_pods(client, "verifier")] == ["10.0.0.7:1"]
        await beat.stop()
    finally:
        await client.aclose()
        server.stop()


async def test_a_pod_is_registered_with_its_facts_before_it_reports_serving(redis_server):
    """Readiness (gRPC health) turns on only once the gateway can find the pod."""
    from grpc_health.v1 import health_pb2

    from cascade.serving.process import serve_forever
    from cascade.serving.registry import connect
    from cascade.serving.server import GrpcService

    service, reader = GrpcService([]), redis.from_url(redis_server.url)
    await reader.flushdb()
    found_when_serving = []
    mark_serving = service.mark_serving

    async def checked() -> None:
        status = await service.health.Check(health_pb2.HealthCheckRequest(), None)
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING  # not before this
        found_when_serving.append(await live_pods(reader, "verifier"))
        await mark_serving()

    service.mark_serving = checked
    task = asyncio.create_task(serve_forever(service, "verifier", connect(redis_server.url),
                                             None, lambda: 0, {"dtype": "bfloat16"}))
    while not found_when_serving:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await service.drain()
    await reader.aclose()
    (pod,) = found_when_serving[0]
    assert pod.address == service.address and pod.facts == {"dtype": "bfloat16"}
