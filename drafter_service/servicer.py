"""Thin gRPC servicer: a RunSession stream per session, run by a DraftLoop."""

from __future__ import annotations

from concurrent.futures import Executor

from cascade.core.runner import ModelRunner
from cascade.serving import metrics
from cascade.serving.channels import ChannelPool
from cascade.v1 import drafter_pb2_grpc
from drafter_service.draft_loop import DraftLoop


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, runner: ModelRunner, executor: Executor, channels: ChannelPool) -> None:
        self.runner, self.executor, self.channels = runner, executor, channels
        self.num_active = 0

    async def RunSession(self, request, context):
        if not request.verifier_address:
            raise ValueError("verifier_address must name the verifier (host:port)")
        loop = DraftLoop(self.runner, self.executor, request)
        channel = self.channels.get(request.verifier_address)
        self.num_active += 1
        metrics.DRAFTER_SESSIONS.set(self.num_active)
        try:
            async for result in loop.run(channel, context.time_remaining()):
                yield result
        finally:
            self.num_active -= 1
            metrics.DRAFTER_SESSIONS.set(self.num_active)
