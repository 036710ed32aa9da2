"""One session on a drafter: draft a block, stream it to the verifier, apply the verdict, and
relay the round to the gateway.

The proposer keeps its own per-sequence state in step with the committed tokens (the model
proposer's cache follows them by position), so applying a verdict is just extending the committed
list; the rejected tail is rolled back on the next proposal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor

import grpc

from cascade.core.proposers import ProposerContext, new_proposer
from cascade.core.runner import ModelRunner
from cascade.pod.messages import (
    draft_to_pb,
    features_from_pb,
    num_open_replies,
    round_from_verdict,
)
from cascade.protocol.settings import DraftConfig
from cascade.protocol.validation import SessionSettings
from cascade.serving import metrics
from cascade.serving.delay import LinkDelay
from cascade.serving.errors import StaleEpoch
from cascade.serving.telemetry import current_context, start_span
from cascade.v1 import common_pb2, drafter_pb2, verifier_pb2, verifier_pb2_grpc


def _micros(since: float) -> int:
    return int((time.perf_counter() - since) * 1e6)


class DraftLoop:
    def __init__(self, runner: ModelRunner, executor: Executor,
                 request: drafter_pb2.RunSessionRequest, settings: SessionSettings,
                 config: DraftConfig, delay: LinkDelay = LinkDelay()) -> None:
        """``settings`` and ``config``: what the request carries, checked by the servicer;
        ``delay``: injected network delay to the verifier (cascade.serving.delay)."""
        self.request = request
        self.link = delay.for_session(request.session_id)
        self.params, self.config = settings.sampling, config
        self.proposer = new_proposer(ProposerContext(runner, self.params, self.config,
                                                     settings.policy, request.prompt_len))
        self.executor = executor
        self.committed = list(request.context_tokens)
        self.trace_context = current_context()  # the RunSession span: parent of each `draft`

    def _open_message(self) -> verifier_pb2.VerifyRequest:
        r = self.request
        layers = self.proposer.feature_layers if self.proposer.wants_target_features else ()
        return verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(
            session_id=r.session_id, epoch=r.epoch, context_tokens=r.context_tokens,
            prompt_len=r.prompt_len, sampling=r.sampling, acceptance=r.acceptance,
            feature_layers=layers, owner_tag=r.owner_tag))

    async def _read(self, call) -> verifier_pb2.Verdict:
        verdict = await call.read()
        if verdict is grpc.aio.EOF:
            raise ConnectionError("verifier closed the stream")
        if verdict.is_stale:
            raise StaleEpoch(f"session {self.request.session_id} moved on at the verifier")
        if verdict.HasField("features"):
            self.proposer.observe(features_from_pb(verdict.features))
        return verdict

    async def _draft(self, round_number: int) -> verifier_pb2.DraftBlock:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        budget = self.config.budget(self.params, len(self.committed) - self.request.prompt_len)
        with start_span("draft", self.trace_context, session_id=self.request.session_id,
                        round=round_number) as span:
            draft = await loop.run_in_executor(
                self.executor, self.proposer.propose, self.committed, budget)
            span.set_attribute("num_draft", draft.num_tokens)
        metrics.DRAFT_SECONDS.observe(time.perf_counter() - started)
        block = draft_to_pb(draft, session_id=self.request.session_id, epoch=self.request.epoch,
                            round=round_number, base_len=len(self.committed),
                            draft_us=_micros(started))
        return block

    async def run(self, channel: grpc.aio.Channel, timeout: float | None
                  ) -> AsyncIterator[common_pb2.Round]:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=timeout)
        try:
            await _send(call, self._open_message())
            if self.proposer.wants_target_features:  # the context's features come first
                for _ in range(num_open_replies(len(self.committed))):
                    await self._read(call)
            round_number = 0
            while True:
                block = await self._draft(round_number)
                sent = time.perf_counter()
                await self.link.wait()  # the block's trip to the verifier
                await _send(call, verifier_pb2.VerifyRequest(block=block))
                verdict = await self._read(call)
                await self.link.wait()  # the verdict's trip back
                self.committed.extend(verdict.tokens)
                yield round_from_verdict(verdict, block.tokens, block.draft_us,
                                         _micros(sent) + block.draft_us)
                if verdict.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    break
                round_number += 1
            await call.done_writing()
        finally:
            call.cancel()


async def _send(call, message: verifier_pb2.VerifyRequest) -> None:
    """Write to the verifier; if it has already ended the stream, raise its status (such as
    RESOURCE_EXHAUSTED when it had no memory for the session), not a write error."""
    try:
        await call.write(message)
    except asyncio.InvalidStateError:
        code = await call.code()
        raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), await call.trailing_metadata(),
                                   details=await call.details()) from None
