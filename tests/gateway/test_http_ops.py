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
