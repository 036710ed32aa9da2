"""gRPC server lifecycle shared by the drafter and verifier: health, reflection, drain.

Drain contract (matches the Kubernetes preStop -> SIGTERM sequence): health turns NOT_SERVING and
the pod leaves the registry, in-flight streams get ``grace_s`` seconds to finish, then the server
stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cascade.serving.errors import ErrorInterceptor
from cascade.serving.mesh.security import OPEN, MeshSecurity
from cascade.serving.registry import Heartbeat
from cascade.serving.watchdog import ExecutorWatchdog

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
"""Pings every 20 s, a peer silent for 10 s more is gone: a dead machine's streams fail in
about 30 s instead of hanging on TCP. Servers and channels use the same settings."""
MIN_PING_INTERVAL = "grpc.http2.min_ping_interval_without_data_ms"
"""The server's ping policy: pings closer than this, with no data between, are strikes (two
strikes: a GOAWAY ``too_many_pings``). gRPC's default, 5 minutes, is far above the 20 s
clients ping at."""
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    *KEEPALIVE_OPTIONS,
    (MIN_PING_INTERVAL, 10_000),
]


def server_options(max_receive_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """SERVER_OPTIONS with another limit on received messages."""
    return [("grpc.max_receive_message_length", max_receive_bytes),
            *(option for option in SERVER_OPTIONS
              if option[0] != "grpc.max_receive_message_length")]


@dataclass
class ServiceBinding:
    """One servicer to add to the server and its full service name (for health/reflection)."""

    add: Callable[[object, grpc.aio.Server], None]
    servicer: object
    name: str


class GrpcService:
    def __init__(self, bindings: list[ServiceBinding], host: str = "127.0.0.1", port: int = 0,
                 grace_s: float = 10.0, watchdog: ExecutorWatchdog | None = None,
                 mesh: MeshSecurity = OPEN, health_port: int | None = None,
                 max_receive_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.bindings, self.host, self.port, self.grace_s = bindings, host, port, grace_s
        self.max_receive_bytes = max_receive_bytes
        """Largest request message (RESOURCE_EXHAUSTED above it, before it is parsed): the
        gateway's public port takes what its HTTP API takes (--max-body-bytes)."""
        self.mesh = mesh
        """Mutual TLS and/or the shared token the port requires (pods; the gateway's public
        API authenticates clients with API keys instead)."""
        self.health_port = health_port
        """Also serve gRPC health alone on this plaintext port (None: not)."""
        self._health_server: grpc.aio.Server | None = None
        self.heartbeat: Heartbeat | None = None
        self.health: health.aio.HealthServicer | None = None
        self.server: grpc.aio.Server | None = None
        self.is_draining = False
        self.watchdog = watchdog
        """Watches the model thread (pods): a stuck one turns health off (see watchdog)."""
        self._watch: asyncio.Task | None = None
        self.companions: list = []
        """Background work that lives as long as the service (objects with async ``start`` and
        ``stop``), e.g. a drafter's speculation-memory feed."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self, serving: bool = True) -> int:
        """Binds, starts serving and marks every service SERVING (``serving`` False: not yet,
        ``mark_serving`` does); returns the bound port.

        The server is created here, inside the running event loop it will serve on."""
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(
            interceptors=[*self.mesh.server_interceptors(), ErrorInterceptor()],
            options=server_options(self.max_receive_bytes))
        for binding in self.bindings:
            binding.add(binding.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [b.name for b in self.bindings]
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME], self.server)
        credentials = self.mesh.server_credentials()
        bind = f"{self.host}:{self.port}"
        self.port = (self.server.add_secure_port(bind, credentials) if credentials
                     else self.server.add_insecure_port(bind))
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)  # until marked
        await self.server.start()
        if self.health_port is not None:
            await self._serve_plain_health()
        if self.heartbeat:
            await self.heartbeat.start()
        if serving:
            await self.mark_serving()
        if self.watchdog:
            self._watch = asyncio.create_task(self.watchdog.run(self._stalled, self._recovered))
        for companion in self.companions:
            await companion.start()
        return self.port

    async def mark_serving(self) -> None:
        """Health SERVING for every service (probes: ready)."""
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def _serve_plain_health(self) -> None:
        """gRPC health alone on a plaintext port, for probes that cannot speak mutual TLS (the
        kubelet's); it tells whether the pod serves, nothing more."""
        self._health_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self.health_port = self._health_server.add_insecure_port(
            f"{self.host}:{self.health_port}")
        await self._health_server.start()

    async def _set_health(self, status: int) -> None:
        if self.health is None:
            return
        for name in ["", *(b.name for b in self.bindings)]:
            await self.health.set(name, status)

    async def _stalled(self) -> None:
        """The model thread is stuck: health NOT_SERVING and out of the registry."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.heartbeat:
            await self.heartbeat.stop()

    async def _recovered(self) -> None:
        if self.is_draining:
            return
        if self.heartbeat:
            await self.heartbeat.start()
        await self.mark_serving()

    async def drain(self) -> None:
        """Stop taking work, let in-flight streams finish within the grace period, stop."""
        if self.is_draining or self.server is None or self.health is None:
            return
        self.is_draining = True
        if self._watch:
            self._watch.cancel()
        await self.health.enter_graceful_shutdown()
        if self.heartbeat:
            await self.heartbeat.stop()
        await self.server.stop(self.grace_s)
        for companion in self.companions:
            await companion.stop()
        if self._health_server is not None:
            await self._health_server.stop(0)

    async def run_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT, then drain."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("draining (grace %.1fs)", self.grace_s)
        await self.drain()
