"""One generation: a single trace across gateway, drafter and verifier, and consistent metrics."""

import asyncio

import grpc
import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from cascade.serving.telemetry import setup_telemetry
from cascade.v1 import gateway_pb2, gateway_pb2_grpc

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def tracing():
    """Installed before the cluster fixture builds any gRPC server or channel."""
    setup_telemetry("cascade-test", environ={}, extra=[SimpleSpanProcessor(EXPORTER)])
    return EXPORTER


async def generate(cluster, prompt: str, k: int = 3):
    async with grpc.aio.insecure_channel(cluster.grpc_address) as channel:
        request = gateway_pb2.GenerateRequest(prompt=prompt, num_draft_tokens=k, temperature=0,
                                              draft_schedule="fixed")  # every round drafts
        request.max_tokens = 16
        return [r async for r in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=60)]


async def scrape(cluster) -> dict[tuple[str, tuple], float]:
    """The gateway's samples, by name and labels other than the model's name (on every one)."""
    async with httpx.AsyncClient(base_url=cluster.http_url) as http:
        text = (await http.get("/metrics")).text
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert samples and all(s.labels.pop("model_name") == model for s in samples)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}


async def finished_spans(tracing, name: str, timeout_s: float = 5.0):
    """The finished spans once one named ``name`` is among them: a server's span ends when
    its handler returns, which may be after the client has read the last message."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not any(s.name == name for s in tracing.get_finished_spans()):
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.01)
    return tracing.get_finished_spans()


async def test_one_generation_is_one_trace_across_services(tracing, cluster):
    tracing.clear()
    await generate(cluster, "import os\n")
    spans = await finished_spans(tracing, "/cascade.v1.Verifier/Verify")
    root = next(s for s in spans if s.name == "generate")
    in_trace = [s for s in spans if s.context.trace_id == root.context.trace_id]
    names = {s.name for s in in_trace}
    assert {"generate", "commit", "draft", "verify"} <= names
    assert {"/cascade.v1.Drafter/RunSession", "/cascade.v1.Verifier/Verify"} <= names
    verify = [s for s in in_trace if s.name == "verify"]
    assert all("num_accepted" in s.attributes and "num_draft" in s.attributes for s in verify)
    assert len({s.context.trace_id for s in spans if s.name in {"draft", "verify"}}) == 1


async def test_spec_decode_metrics_match_the_session(cluster):
    before = await scrape(cluster)
    responses = await generate(cluster, "class Config:")
    after = await scrape(cluster)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    drafted = delta("cascade:spec_decode_num_draft_tokens_total")
    accepted = delta("cascade:spec_decode_num_accepted_tokens_total")
    assert drafted == sum(r.stats.num_drafted for r in responses) > 0
    assert accepted == sum(r.stats.num_accepted for r in responses) <= drafted
    assert delta("cascade:spec_decode_num_drafts_total") == sum(
        1 for r in responses if r.stats.num_drafted)
    per_position = sum(delta("cascade:spec_decode_num_accepted_tokens_per_pos_total",
                             position=str(p)) for p in range(3))
    assert per_position == accepted
    assert delta("cascade:generation_tokens_total") == sum(len(r.token_ids) for r in responses)
    assert delta("cascade:time_to_first_token_seconds_count") == 1
    assert after[("cascade:num_requests_running", ())] == 0


def test_tracing_stays_off_without_an_exporter():
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    assert setup_telemetry("cascade-test", environ={}) is None
    assert trace.get_tracer_provider() is before


async def test_health_watch_works_with_tracing_installed(tracing):
    """Health Watch streams (a servicer writing with context.write) pass through the error
    interceptor, and tracing leaves the health service alone: both broke the stream."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from cascade.serving.server import GrpcService

    service = GrpcService([])
    await service.start()
    try:
        async with grpc.aio.insecure_channel(service.address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            first = await asyncio.wait_for(watch.read(), timeout=10)
            watch.cancel()
    finally:
        await service.drain()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
