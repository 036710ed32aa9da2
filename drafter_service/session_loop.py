"""One session on a drafter: draft a block, stream it to the verifier, apply the verdict.

The drafter's cache follows the committed tokens by position (DraftSession.propose syncs it), so
applying a verdict is just extending the committed list; the rejected tail is rolled back on the
next proposal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor

import grpc

from cascade.drafting import DraftSession
from cascade.runner import ModelRunner
from cascade.serving import metrics
from cascade.serving.errors import StaleEpoch
from cascade.serving.telemetry import current_context, start_span
from cascade.v1 import common_pb2, drafter_pb2, verifier_pb2, verifier_pb2_grpc
from cascade.wire import block_to_pb, draft_settings_from_pb, sampling_from_pb


def _micros(since: float) -> int:
    return int((time.perf_counter() - since) * 1e6)


class SessionLoop:
    def __init__(self, runner: ModelRunner, executor: Executor,
                 request: drafter_pb2.RunSessionRequest) -> None:
        self.request = request
        self.params = sampling_from_pb(request.sampling)
        self.config = draft_settings_from_pb(request.draft)
        self.drafts = DraftSession(runner, self.params, self.config)
        self.executor = executor
        self.committed = list(request.context_tokens)
        self.trace_context = current_context()  # the RunSession span: parent of each `draft`

    def _draft_limit(self) -> int:
        generated = len(self.committed) - self.request.prompt_len
        return min(self.config.num_draft_tokens, self.params.max_drafts_after(generated))

    def _open_message(self) -> verifier_pb2.VerifyRequest:
        r = self.request
        return verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(
            session_id=r.session_id, epoch=r.epoch, context_tokens=r.context_tokens,
            prompt_len=r.prompt_len, sampling=r.sampling))

    async def _draft(self, round_number: int) -> verifier_pb2.VerifyRequest:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        with start_span("draft", self.trace_context, session_id=self.request.session_id,
                        round=round_number) as span:
            block = await loop.run_in_executor(
                self.executor, self.drafts.propose, self.committed, self._draft_limit())
            span.set_attribute("num_draft", block.num_tokens)
        metrics.DRAFT_SECONDS.observe(time.perf_counter() - started)
        msg = block_to_pb(block, session_id=self.request.session_id, epoch=self.request.epoch,
                          round=round_number, base_len=len(self.committed),
                          draft_us=_micros(started))
        return verifier_pb2.VerifyRequest(block=msg)

    async def run(self, channel: grpc.aio.Channel, timeout: float | None) -> AsyncIterator[common_pb2.Round]:
        call = verifier_pb2_grpc.VerifierStub(channel).Verify(timeout=timeout)
        try:
            await call.write(self._open_message())
            round_number = 0
            while True:
                request = await self._draft(round_number)
                sent = time.perf_counter()
                await call.write(request)
                verdict = await call.read()
                if verdict is grpc.aio.EOF:
                    raise ConnectionError("verifier closed the stream")
                if verdict.is_stale:
                    raise StaleEpoch(f"session {self.request.session_id} moved on at the verifier")
                result = verdict.result
                result.round_us = _micros(sent) + result.draft_us
                self.committed.extend(result.tokens)
                yield result
                if result.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    break
                round_number += 1
            await call.done_writing()
        finally:
            call.cancel()
