"""Models, health, readiness and metrics endpoints."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from http_fixtures import (
    MODEL,
    SETTINGS,
    FakeGenerator,
    make_client,
    make_openai,
)


async def test_models_health_ready_metrics(tokenizer):
    registry = CollectorRegistry()
    Counter("cascade_test_events", "A test counter.", registry=registry).inc(3)
    state = {"ready": False}

    async def ready() -> bool:
        return state["ready"]

    async with make_client(tokenizer, FakeGenerator([[1]]), ready=ready, registry=registry) as http:
        models = (await http.get("/v1/models")).json()
        sdk_models = [m.id async for m in make_openai(http).models.list()]
        health = await http.get("/health")
        not_ready = await http.get("/ready")
        state["ready"] = True
        is_ready = await http.get("/ready")
        metrics = await http.get("/metrics")
        missing = await http.get("/v1/nothing")
    assert models["object"] == "list" and sdk_models == [MODEL]
    assert models["data"][0] == {"id": MODEL, "object": "model",
                                 "created": models["data"][0]["created"], "owned_by": "cascade",
                                 "max_model_len": SETTINGS.context_length}
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert not_ready.status_code == 503 and is_ready.status_code == 200
    assert "cascade_test_events_total 3.0" in metrics.text
    assert metrics.headers["content-type"].startswith("text/plain")
    assert missing.status_code == 404 and "error" in missing.json()


async def test_ready_by_default(tokenizer):
    async with make_client(tokenizer, FakeGenerator([[1]])) as http:
        assert (await http.get("/ready")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200


async def test_models_say_what_the_verifiers_serve_the_model_in(tokenizer, redis_server):
    """The verifiers' registry entries carry their dtype; /v1/models reads the live ones."""
    import redis.asyncio as aioredis

    from cascade.serving.registry import Heartbeat
    from gateway.server import serving_facts

    client = aioredis.from_url(redis_server.url)
    await client.flushdb()
    facts = lambda: serving_facts(client)  # noqa: E731
    async with make_client(tokenizer, FakeGenerator([[1]]), serving=facts) as http:
        assert "dtype" not in (await http.get("/v1/models")).json()["data"][0]  # none live
        await Heartbeat(client, "verifier", "10.0.0.1:1", lambda: 0,
                        facts={"dtype": "bfloat16"}).beat()
        listed = (await http.get("/v1/models")).json()["data"][0]
        await Heartbeat(client, "verifier", "10.0.0.2:1", lambda: 0,
                        facts={"dtype": "float32"}).beat()
        mixed = (await http.get(f"/v1/models/{MODEL}")).json()
    await client.aclose()
    assert listed["dtype"] == "bfloat16" and listed["id"] == MODEL
    assert mixed["dtype"] == "bfloat16,float32"


async def test_the_model_list_does_not_wait_out_a_redis_failover():
    """The registry read is bounded: the client's own retries would hold /v1/models for
    seconds while Redis is unreachable."""
    import time

    from cascade.serving.registry import connect
    from cascade.tools.redis_server import free_port
    from gateway.server import SERVING_FACTS_TIMEOUT_S, serving_facts

    client = connect(f"redis://127.0.0.1:{free_port()}/0", timeout_s=5.0, retries=20)
    started = time.perf_counter()
    assert await serving_facts(client) == {}
    assert time.perf_counter() - started < SERVING_FACTS_TIMEOUT_S + 1.0
    await client.aclose()
