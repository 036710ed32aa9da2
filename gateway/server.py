"""Assemble and run the gateway: HTTP (uvicorn) and gRPC Generate in one event loop."""

from __future__ import annotations

import asyncio
import json
import math
import logging
import signal
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import redis.asyncio as redis
import uvicorn
from huggingface_hub import hf_hub_download
from transformers import PreTrainedTokenizerFast

from cascade.protocol.names import default_model_id
from cascade.serving.channels import ChannelPool
from cascade.serving.mesh.security import OPEN, MeshSecurity
from cascade.serving.registry import live_pods
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.auth import ApiKeys
from gateway.grpc_api import GatewayServicer
from gateway.http_app import create_app
from gateway.limits import KeyLimits
from gateway.sessions.orchestrator import Orchestrator, OrchestratorSettings
from gateway.sessions.session_store import SessionStore, connect
from gateway.settings import GatewaySettings, HttpSettings

log = logging.getLogger("gateway")
SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


def context_length(model: str) -> int:
    """The target's context in tokens, from its config.json (read as JSON: the gateway loads no
    model code, so neither transformers' model configs nor torch)."""
    folder = Path(model)
    path = folder / "config.json" if folder.is_dir() else Path(hf_hub_download(model,
                                                                               "config.json"))
    config = json.loads(path.read_text())
    found = config.get("max_position_embeddings") or config.get("n_positions")
    if not found:
        raise ValueError(f"{path} states no context length (max_position_embeddings)")
    return int(found)


def load_tokenizer(model: str) -> PreTrainedTokenizerFast:
    """The target's fast tokenizer (tokenizer.json), loaded without torch."""
    return PreTrainedTokenizerFast.from_pretrained(model)


class Lifecycle:
    """Whether the gateway is draining: readiness turns 503 first, so load balancers stop
    sending it work while in-flight streams finish."""

    def __init__(self) -> None:
        self.draining = False
        self.orchestrator: Orchestrator | None = None
        """Set by build_gateway: its pending status writes are awaited before exit."""


class _SignalFreeServer(uvicorn.Server):
    """uvicorn without its own signal handling: it would restore the default SIGTERM handler
    and re-raise the signal when it returns, killing the process before the gRPC side has
    drained. ``serve`` below handles the signals for both servers."""

    @contextmanager
    def capture_signals(self):
        yield


def build_gateway(settings: GatewaySettings, client: redis.Redis,
                  lifecycle: Lifecycle | None = None, mesh: MeshSecurity = OPEN,
                  orchestration: OrchestratorSettings | None = None):
    """Returns (FastAPI app, GrpcService) sharing one orchestrator (``orchestration``: its
    settings, instead of those the flags set)."""
    lifecycle = lifecycle or Lifecycle()
    tokenizer = load_tokenizer(settings.model)
    name = settings.model_name or default_model_id(settings.model)
    http = HttpSettings.of(settings, name, context_length(settings.model))
    store = SessionStore(client, lease_s=settings.session_lease_s,
                         wait_replicas=settings.redis_wait_replicas,
                         finished_ttl_s=settings.finished_session_ttl_s)
    orchestration = (replace(orchestration, model_name=name) if orchestration
                     else settings.orchestrator(name))
    orchestrator = Orchestrator(client, store, ChannelPool(mesh), orchestration)

    lifecycle.orchestrator = orchestrator

    def ready() -> bool:
        """The gateway's own state only: while Redis or every verifier is unavailable, every
        gateway stays in its Service and answers 503 + Retry-After (a shared dependency must
        not take every gateway out of it at once: clients would get connection refused)."""
        return not lifecycle.draining

    limits = KeyLimits(settings.max_sessions_per_key, settings.tokens_per_minute_per_key)
    app = create_app(http, tokenizer, orchestrator, ready=ready, limits=limits,  # one
                     serving=partial(serving_facts, client))
    servicer = GatewayServicer(tokenizer, orchestrator, name,  # limiter for HTTP and gRPC
                               http.server_defaults(tokenizer.eos_token_id),
                               ApiKeys(settings.keys), limits, settings.max_body_bytes)
    binding = ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server, servicer,
                             SERVICE_NAME)
    return app, GrpcService([binding], settings.host, settings.grpc_port, settings.grace_s,
                            max_receive_bytes=settings.max_body_bytes)


SERVING_FACTS_TIMEOUT_S = 1.0
"""How long /v1/models waits for the registry: the client's retries ride out a Redis failover
for seconds, and the model list must not wait for them."""


async def serving_facts(client: redis.Redis) -> dict[str, str]:
    """What the live verifiers serve the model in: ``{"dtype": "bfloat16"}`` (several, comma-
    separated, while verifiers of different dtypes serve, e.g. mid-rollout); empty when none
    answers or Redis does not within ``SERVING_FACTS_TIMEOUT_S``."""
    try:
        verifiers = await asyncio.wait_for(live_pods(client, "verifier"),
                                           SERVING_FACTS_TIMEOUT_S)
    except (redis.RedisError, asyncio.TimeoutError):
        return {}
    dtypes = sorted({str(p.facts["dtype"]) for p in verifiers if "dtype" in p.facts})
    return {"dtype": ",".join(dtypes)} if dtypes else {}


async def serve(config: GatewaySettings, mesh: MeshSecurity = OPEN) -> None:
    """Serve HTTP and gRPC until SIGTERM or SIGINT, then drain both: readiness and gRPC health
    turn off, new connections are refused, in-flight requests and streams get ``grace_s`` to
    finish, those still running are cancelled (so their clients resume them on another
    gateway at once), and the process exits 0."""
    client = connect(config.redis_url)
    lifecycle = Lifecycle()
    app, grpc_service = build_gateway(config, client, lifecycle, mesh)
    await grpc_service.start()
    server = _SignalFreeServer(uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning", lifespan="off",
        timeout_graceful_shutdown=math.ceil(config.grace_s)))
    drained: list[asyncio.Task] = []

    def begin_drain() -> None:
        if lifecycle.draining:
            return
        log.info("draining (grace %.1fs)", config.grace_s)
        lifecycle.draining = True
        server.should_exit = True  # uvicorn stops accepting, then waits for in-flight requests
        drained.append(asyncio.create_task(grpc_service.drain()))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, begin_drain)
    log.info("gateway HTTP on %s:%d, gRPC on %s", config.host, config.port, grpc_service.address)
    try:
        await server.serve()  # returns once draining and in-flight requests ended
    finally:
        await (drained[0] if drained else grpc_service.drain())
        # Streams cut at the end of the grace period are being closed (uvicorn cancels their
        # tasks without waiting) and marked cancelled: let that land, so their clients can
        # resume them on another gateway at once.
        if server.server_state.tasks:
            await asyncio.wait(set(server.server_state.tasks), timeout=5.0)
        if lifecycle.orchestrator is not None:
            await lifecycle.orchestrator.settle()
        await client.aclose()
