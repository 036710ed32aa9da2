"""A whole cluster in one event loop: real Redis, verifier and drafter gRPC servers on loopback,
the gateway's HTTP app under uvicorn and its gRPC service. Models: the tiny default pair."""

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as redis
import uvicorn

from cascade.tools.redis_server import free_port
from cascade.core.memory.suffix_index import SuffixIndex
from cascade.serving.registry import Heartbeat
from drafter_service.server import build_drafter
from gateway.server import build_gateway
from cascade.serving.mesh.security import MeshSettings
from gateway.settings import GatewaySettings
from verifier_service.server import build_verifier


class Cluster:
    def __init__(self, http_url, grpc_address, client, target, services):
        self.http_url, self.grpc_address = http_url, grpc_address
        self.client, self.target, self.services = client, target, services


async def _start_pod(service, role, client, load):
    await service.start()
    service.heartbeat = Heartbeat(client, role, service.address, load)
    await service.heartbeat.start()
    return service


@asynccontextmanager
async def running_cluster(redis_url: str, target_dir: Path, target, drafter, name: str,
                          verifier_settings=None, orchestrator=None, **gateway):
    client = redis.from_url(redis_url)
    await client.flushdb()
    verifier, sessions = build_verifier(target, grace_s=1.0, settings=verifier_settings)
    draft_service, servicer = build_drafter(drafter, grace_s=1.0, memory=SuffixIndex(),
                                            registry=client)
    await _start_pod(verifier, "verifier", client, lambda: sessions.num_active)
    await _start_pod(draft_service, "drafter", client, lambda: servicer.num_active)
    config = GatewaySettings(model=str(target_dir), mesh=MeshSettings(redis_url=redis_url),
                             model_name=name, grpc_port=0, max_tokens_limit=256, **gateway)
    app, gateway_grpc = build_gateway(config, client, orchestration=orchestrator)
    await gateway_grpc.start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        cluster = Cluster(f"http://127.0.0.1:{port}", gateway_grpc.address, client, target,
                          {"verifier": verifier, "drafter": draft_service})
        cluster.verifier_sessions = sessions
        cluster.drafter_servicer = servicer
        yield cluster
    finally:
        server.should_exit = True
        await task
        for service in (gateway_grpc, draft_service, verifier):
            await service.drain()
        await client.aclose()


@pytest.fixture
def cluster_with(redis_server, tiny_pair_dirs, tiny_runners):
    """``async with cluster_with(verifier_settings) as cluster``: a tiny cluster whose verifier
    (and gateway orchestrator, ``orchestrator=``, and GatewaySettings fields) has the given
    settings."""
    return lambda settings, orchestrator=None, **gateway: running_cluster(
        redis_server.url, tiny_pair_dirs[0], *tiny_runners, "tiny", verifier_settings=settings,
        orchestrator=orchestrator, **gateway)


@pytest.fixture
async def cluster(redis_server, tiny_pair_dirs, tiny_runners):
    target, drafter = tiny_runners
    async with running_cluster(redis_server.url, tiny_pair_dirs[0], target, drafter, "tiny") as c:
        yield c
