"""The verifier's per-session state: epochs, rounds, and the target-side VerifySession.

Fencing: the highest epoch seen per session wins. A block whose epoch or base_len does not match
is answered with a stale verdict and changes nothing; a block repeated with the round just
verified gets the same verdict again (idempotent on (session_id, epoch, round)).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from cascade.runner import ModelRunner
from cascade.serving import metrics
from cascade.serving.errors import StaleEpoch
from cascade.serving.telemetry import current_context, start_span
from cascade.v1 import common_pb2, verifier_pb2
from cascade.verification import VerifySession
from cascade.wire import block_from_pb, round_to_pb, sampling_from_pb


@dataclass
class SessionEntry:
    session_id: str
    epoch: int
    session: VerifySession
    last_round: int = -1
    last_verdict: verifier_pb2.Verdict | None = None
    trace_context: object = None
    """The RPC's trace context, parent of this session's ``verify`` spans."""


class VerifierSessions:
    def __init__(self, runner: ModelRunner, executor: Executor) -> None:
        self.runner = runner
        self.executor = executor
        self.entries: dict[str, SessionEntry] = {}
        self.highest_epoch: dict[str, int] = {}

    @property
    def num_active(self) -> int:
        return len(self.entries)

    def open(self, msg: verifier_pb2.SessionOpen) -> SessionEntry:
        if not msg.session_id:
            raise ValueError("session_id must not be empty")
        seen = self.highest_epoch.get(msg.session_id, 0)
        if msg.epoch < seen:
            raise StaleEpoch(f"session {msg.session_id}: epoch {msg.epoch} < current {seen}")
        params = sampling_from_pb(msg.sampling)
        session = VerifySession(self.runner, list(msg.context_tokens), params, msg.prompt_len)
        entry = SessionEntry(msg.session_id, msg.epoch, session, trace_context=current_context())
        self.highest_epoch[msg.session_id] = msg.epoch
        self.entries[msg.session_id] = entry
        metrics.VERIFIER_SESSIONS.set(len(self.entries))
        return entry

    def close(self, entry: SessionEntry) -> None:
        """Drop the KV cache when its stream ends (unless a newer epoch replaced it)."""
        if self.entries.get(entry.session_id) is entry:
            del self.entries[entry.session_id]
            metrics.VERIFIER_SESSIONS.set(len(self.entries))

    def _is_stale(self, entry: SessionEntry, block: verifier_pb2.DraftBlock) -> bool:
        current = self.highest_epoch.get(entry.session_id, 0)
        return (block.session_id != entry.session_id or block.epoch != entry.epoch
                or entry.epoch < current or block.base_len != len(entry.session.committed))

    async def verify(self, entry: SessionEntry, block: verifier_pb2.DraftBlock) -> verifier_pb2.Verdict:
        if block.epoch == entry.epoch and block.round == entry.last_round and entry.last_verdict:
            return entry.last_verdict  # a resent block: answer again, change nothing
        if self._is_stale(entry, block):
            return self._stale(entry, block)
        draft = block_from_pb(block)
        with start_span("verify", entry.trace_context, session_id=entry.session_id,
                        round=block.round, num_draft=draft.num_tokens) as span:
            verdict, seconds = await self._run_model(entry, draft)
            span.set_attribute("num_accepted", verdict.num_accepted)
        metrics.VERIFY_SECONDS.observe(seconds)
        metrics.observe_block(draft.num_tokens, verdict.num_accepted)
        result = round_to_pb(verdict, block.round, draft.num_tokens)
        result.draft_us = block.draft_us
        result.verify_us = int(seconds * 1e6)
        entry.last_round = block.round
        entry.last_verdict = verifier_pb2.Verdict(
            session_id=entry.session_id, epoch=entry.epoch, round=block.round, result=result)
        return entry.last_verdict

    async def _run_model(self, entry: SessionEntry, draft):
        """Verify on the model thread; the queue depth counts blocks waiting for or in it."""
        metrics.VERIFIER_QUEUE_DEPTH.inc()
        try:
            started = time.perf_counter()
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(self.executor, entry.session.verify, draft)
            return verdict, time.perf_counter() - started
        finally:
            metrics.VERIFIER_QUEUE_DEPTH.dec()

    def _stale(self, entry: SessionEntry, block: verifier_pb2.DraftBlock) -> verifier_pb2.Verdict:
        return verifier_pb2.Verdict(
            session_id=block.session_id, epoch=block.epoch, round=block.round, is_stale=True,
            result=common_pb2.Round(committed_len=len(entry.session.committed)),
        )
