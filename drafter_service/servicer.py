"""Thin gRPC servicer: a RunSession stream per session, run by a DraftLoop."""

from __future__ import annotations

from concurrent.futures import Executor

from cascade.core.model.runner import ModelRunner
from cascade.pod.messages import model_limits
from cascade.core.memory.suffix_index import SessionMemory, SuffixIndex
from cascade.protocol.wire.validation import (
    check_scope,
    check_token_ids,
    check_verifier_address,
    draft_config,
    session_settings,
)
from cascade.serving import metrics
from cascade.serving.mesh.delay import LinkDelay
from cascade.serving.channels import ChannelPool
from cascade.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_service.draft_loop import DraftLoop
from drafter_service.speculation import SpeculationConfig
from drafter_service.verifiers import VerifierPolicy


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, runner: ModelRunner, executor: Executor, channels: ChannelPool,
                 verifiers: VerifierPolicy | None = None, delay: LinkDelay = LinkDelay(),
                 speculation: SpeculationConfig = SpeculationConfig(),
                 memory: SuffixIndex | None = None) -> None:
        """``memory``: the pod's speculation memory (None: the suffix methods draft from each
        session's own tokens only)."""
        self.runner, self.executor, self.channels = runner, executor, channels
        self.memory = memory
        self.verifiers, self.delay = verifiers or VerifierPolicy(), delay
        self.speculation = speculation
        self.limits = model_limits(runner)
        self.num_active = 0

    def _draft_loop(self, request: drafter_pb2.RunSessionRequest) -> DraftLoop:
        """Checks every field (RequestInvalid names it) before a proposer is built."""
        settings = session_settings(request, self.limits)
        config = draft_config(request.draft, settings.policy)
        check_token_ids("draft.prediction", config.prediction, self.limits.vocab_size,
                        self.limits.max_length)
        check_verifier_address(request.verifier_address)
        check_scope(request.memory_scope, "memory_scope")
        check_scope(request.prefix_scope, "prefix_scope")
        memory = None
        if request.HasField("memory_scope") and self.memory is not None:
            memory = SessionMemory(self.memory, request.memory_scope)
        return DraftLoop(self.runner, self.executor, request, settings, config, self.delay,
                         self.speculation, lambda: self.num_active, memory)

    async def RunSession(self, request, context):
        loop = self._draft_loop(request)
        await self.verifiers.check(request.verifier_address)
        self.num_active += 1
        metrics.DRAFTER_SESSIONS.set(self.num_active)
        try:
            with self.channels.using(request.verifier_address) as channel:
                async for result in loop.run(channel, context.time_remaining()):
                    yield result
        finally:
            self.num_active -= 1
            metrics.DRAFTER_SESSIONS.set(self.num_active)
