"""Which pods a session runs on: the verifier and drafter that served a prefix of its prompt
when their load allows (``gateway.sessions.prefix_routing``), else the least-loaded ones, from the
registry; passing over pods cooling down after a hang; and the wait for a live verifier after a
failure."""

from __future__ import annotations

import asyncio
import time

import grpc
import redis.asyncio as redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cascade.protocol.request.mapping import GenerationRequest
from cascade.serving.channels import ChannelPool
from cascade.serving.registry import least_loaded
from gateway.sessions.assignment import OrchestratorSettings, SessionJob
from gateway.sessions.generation import Overloaded
from gateway.sessions.prefix_routing import PrefixRouter
from gateway.sessions.sharing import prefix_scope

POD_POLL_S = 0.5
"""How often a session waiting for a live verifier looks again."""


class PodPicker:
    def __init__(self, client: redis.Redis, channels: ChannelPool,
                 settings: OrchestratorSettings) -> None:
        self.client, self.channels, self.settings = client, channels, settings
        self._cooling: dict[str, float] = {}
        """Pods that hung -> when (monotonic) they may be picked again."""
        self.prefixes = PrefixRouter(client)

    async def pick(self, request: GenerationRequest, exclude: set[str]) -> tuple[str | None, str]:
        """The verifier and the drafter holding a prefix of the prompt when their load allows,
        else the least-loaded ones, passing over pods cooling down after a hang: a verifier
        that is cooling is still used when no other one is left; a drafter is not (the
        verifier then decodes alone, which is exact too)."""
        cooling = self.cooling_now()
        scope = prefix_scope(self.settings.prefix_sharing, request.caller)
        prompt = request.prompt_tokens
        verifier = (await self.prefixes.pick("verifier", prompt, scope, exclude | cooling)
                    or await least_loaded(self.client, "verifier", exclude | cooling)
                    or await least_loaded(self.client, "verifier", exclude))
        if verifier is None:
            raise Overloaded("no verifier is available")
        drafter = None
        if request.num_draft_tokens > 0:
            drafter = (await self.prefixes.pick("drafter", prompt, scope, exclude | cooling)
                       or await least_loaded(self.client, "drafter", exclude | cooling))
        await self.prefixes.served(prompt, scope, verifier, drafter)
        return drafter, verifier

    def cooling_now(self) -> set[str]:
        now = time.monotonic()
        self._cooling = {pod: until for pod, until in self._cooling.items() if until > now}
        return set(self._cooling)

    def cool_down(self, pods: tuple[str, ...]) -> None:
        until = time.monotonic() + self.settings.cooldown_s
        self._cooling.update({pod: until for pod in pods})

    async def repick(self, request: GenerationRequest, job: SessionJob, exclude: set[str]
                     ) -> tuple[str | None, str]:
        """New pods for a session that lost its own; while no verifier is live (all of them
        restarting at once), wait for one, up to ``pod_wait_s``, passing over only the pods
        that still do not answer."""
        deadline = time.monotonic() + self.settings.pod_wait_s
        while True:
            try:
                return await self.pick(request, exclude)
            except Overloaded:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(POD_POLL_S)
            exclude = {a for a in exclude if not await self.is_serving(a)}
            job.excluded &= exclude

    async def is_serving(self, address: str) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channels.get(address))
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
