"""Assemble and run the gateway: HTTP (uvicorn) and gRPC Generate in one event loop."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import redis.asyncio as redis
import uvicorn
from huggingface_hub import hf_hub_download
from transformers import PreTrainedTokenizerFast

from cascade.protocol.methods import DEFAULT_DRAFT_METHOD
from cascade.protocol.names import default_model_id
from cascade.serving.channels import ChannelPool
from cascade.serving.mesh import OPEN, MeshSecurity
from cascade.serving.registry import live_pods
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.auth import ApiKeys
from gateway.grpc_api import GatewayServicer
from gateway.http_app import HttpSettings, create_app
from gateway.limits import KeyLimits
from gateway.sessions.orchestrator import Orchestrator, OrchestratorSettings
from gateway.sessions.session_store import FINISHED_SESSION_TTL_S, SessionStore, connect

log = logging.getLogger("gateway")
SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


@dataclass(frozen=True)
class GatewayConfig:
    model: str
    """Folder (or hub name) of the target model: its tokenizer and context length are used."""
    redis_url: str
    model_name: str = ""
    """Name clients send as `model`; defaults to the folder's last part."""
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 50050
    default_num_draft_tokens: int = 4
    max_tokens_limit: int = 4096
    api_keys: tuple[str, ...] = ()
    """Bearer keys clients must send; empty leaves the API open."""
    grace_s: float = 30.0
    """Seconds in-flight requests get after SIGTERM before the servers stop."""
    playground: bool = True
    """Serve the playground page at /playground/."""
    orchestrator: OrchestratorSettings = OrchestratorSettings()
    """Retries, round timeouts and cool-downs of sessions."""
    mesh: MeshSecurity = OPEN
    """How the gateway dials drafters and verifiers (mutual TLS, shared token)."""
    max_body_bytes: int = 1 << 20
    """Largest HTTP body (413) and gRPC request message (RESOURCE_EXHAUSTED; a prompt over it
    alone, INVALID_ARGUMENT)."""
    max_sessions_per_key: int = 64
    """Concurrent sessions per API key on this gateway (429 / RESOURCE_EXHAUSTED); 0: none."""
    max_tokens_per_minute_per_key: int = 0
    """Tokens per minute per API key on this gateway (429 / RESOURCE_EXHAUSTED); 0: none."""
    session_lease_s: float = 10.0
    """How long a session stays this gateway's after its last renewal: a client resuming on
    another gateway waits at most this long after this one died."""
    default_tree_nodes: int = 0
    """Token-tree nodes per round for requests that do not set draft_tree_nodes (0: chains)."""
    default_draft_method: str = DEFAULT_DRAFT_METHOD
    """The drafting method of requests that do not name one (and can use it)."""
    redis_wait_replicas: int = 0
    """Each round's append returns once this many Redis replicas have it (0: the primary's
    acknowledgement; after a failover the gateway writes back what it holds)."""
    finished_session_ttl_s: int = FINISHED_SESSION_TTL_S
    """How long Redis keeps a session that has ended (finished or failed), for clients that
    replay it; one that can go on is kept an hour after its last write."""


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


def build_gateway(config: GatewayConfig, client: redis.Redis,
                  lifecycle: Lifecycle | None = None):
    """Returns (FastAPI app, GrpcService) sharing one orchestrator."""
    lifecycle = lifecycle or Lifecycle()
    tokenizer = load_tokenizer(config.model)
    name = config.model_name or default_model_id(config.model)
    settings = HttpSettings(model_name=name, context_length=context_length(config.model),
                            max_tokens_limit=config.max_tokens_limit,
                            default_num_draft_tokens=config.default_num_draft_tokens,
                            api_keys=config.api_keys, playground=config.playground,
                            max_body_bytes=config.max_body_bytes,
                            max_sessions_per_key=config.max_sessions_per_key,
                            max_tokens_per_minute_per_key=config.max_tokens_per_minute_per_key,
                            default_tree_nodes=config.default_tree_nodes,
                            default_draft_method=config.default_draft_method)
    store = SessionStore(client, lease_s=config.session_lease_s,
                         wait_replicas=config.redis_wait_replicas,
                         finished_ttl_s=config.finished_session_ttl_s)
    orchestrator = Orchestrator(client, store, ChannelPool(config.mesh),
                                replace(config.orchestrator, model_name=name))

    lifecycle.orchestrator = orchestrator

    def ready() -> bool:
        """The gateway's own state only: while Redis or every verifier is unavailable, every
        gateway stays in its Service and answers 503 + Retry-After (a shared dependency must
        not take every gateway out of it at once: clients would get connection refused)."""
        return not lifecycle.draining

    limits = KeyLimits(config.max_sessions_per_key, config.max_tokens_per_minute_per_key)
    app = create_app(settings, tokenizer, orchestrator, ready=ready, limits=limits,  # one
                     serving=partial(serving_facts, client))
    servicer = GatewayServicer(tokenizer, orchestrator, name,  # limiter for HTTP and gRPC
                               settings.server_defaults(tokenizer.eos_token_id),
                               ApiKeys(config.api_keys), limits, config.max_body_bytes)
    binding = ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server, servicer,
                             SERVICE_NAME)
    return app, GrpcService([binding], config.host, config.grpc_port, config.grace_s,
                            max_receive_bytes=config.max_body_bytes)


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


async def serve(config: GatewayConfig) -> None:
    """Serve HTTP and gRPC until SIGTERM or SIGINT, then drain both: readiness and gRPC health
    turn off, new connections are refused, in-flight requests and streams get ``grace_s`` to
    finish, those still running are cancelled (so their clients resume them on another
    gateway at once), and the process exits 0."""
    client = connect(config.redis_url)
    lifecycle = Lifecycle()
    app, grpc_service = build_gateway(config, client, lifecycle)
    await grpc_service.start()
    server = _SignalFreeServer(uvicorn.Config(app, host=config.host, port=config.port,
                                              log_level="warning", lifespan="off",
                                              timeout_graceful_shutdown=config.grace_s))
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
        await lifecycle.orchestrator.settle()
        await client.aclose()
