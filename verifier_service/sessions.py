"""The verifier's open sessions: epochs, rounds, and each session's SequenceVerifier.

Admission (``verifier_service.admission``): a session's KV memory is reserved when it opens,
waiting for memory (and for its key's fair share) up to ``admission_wait_s``, else
RESOURCE_EXHAUSTED. Blocks go through the ``StepScheduler``, which batches them across sessions.

Fencing: the highest epoch seen per session wins. A block whose epoch or base_len does not match
is answered with a stale verdict and changes nothing; a block repeated with the round just
verified gets the same verdict again (idempotent on (session_id, epoch, round)).

Blocks sent ahead (``DraftBlock.assumes``, speculative speculative decoding): a block that assumes
an outcome of the previous round is verified only when it is the next round and the outcome is
the real one; any other is dropped unanswered (``verify`` returns None) and changes nothing.
While the session catches up (rounds decoded alone since a verdict asked for a block), a block
sent ahead on that verdict's real outcome is the awaited block, and is verified like it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from opentelemetry.context import Context

from cascade.core.blocks import Draft, RoundOutcome
from cascade.core.verify.compiled import compile_target, warm_up
from cascade.core.verify.engine import VerifyEngine
from cascade.core.model.runner import ModelRunner
from cascade.core.verify.step_profile import load_or_profile
from cascade.core.verify.verification import SequenceVerifier
from cascade.pod.messages import (
    assumed_outcome,
    context_feature_chunks,
    draft_from_pb,
    model_limits,
    verdict_to_pb,
)
from cascade.protocol.methods import DEFAULT_DRAFT_METHOD
from cascade.protocol.limits import MAX_DRAFT_TOKENS, MAX_TREE_NODES
from cascade.protocol.wire.validation import (
    check_feature_layers,
    check_scope,
    check_shadow,
    check_tree_nodes,
    session_settings,
)
from cascade.serving import metrics
from cascade.serving.errors import StaleEpoch
from cascade.serving.telemetry import current_context, start_span
from cascade.v1 import verifier_pb2
from verifier_service.admission import Admission
from verifier_service.ahead import guessed_right, untagged
from verifier_service.catch_up import catches_up, rebased
from verifier_service.epochs import EpochMemory
from verifier_service.planner import DraftPlanner, sampling_regime
from verifier_service.scheduler import StepScheduler, VerifierSettings

PROFILE_SECONDS = 15.0
"""Budget of the start-up profile of the pass time (once per model, dtype and machine)."""


@dataclass
class OpenSession:
    """One session this verifier serves at one epoch."""

    session_id: str
    epoch: int
    sequence: SequenceVerifier
    last_round: int = -1
    last_verdict: verifier_pb2.Verdict | None = None
    trace_context: Context | None = None
    """The RPC's trace context, parent of this session's ``verify`` spans."""
    asked_by: verifier_pb2.Verdict | None = None
    """While it catches up: the verdict that asked for the block on its way."""

    def undrafted(self, round_number: int) -> verifier_pb2.DraftBlock:
        """The block of round ``round_number`` decoded alone: no drafted tokens."""
        return verifier_pb2.DraftBlock(session_id=self.session_id, epoch=self.epoch,
                                       round=round_number, base_len=len(self.sequence.committed))


class SessionTable:
    def __init__(self, runner: ModelRunner, executor: Executor,
                 settings: VerifierSettings | None = None, step_cost=None) -> None:
        """``step_cost``: the pass-time model the draft planner uses (default: the runner's
        profile, cached per model, dtype and machine; verifier_service.planner)."""
        self.runner = runner
        self.limits = model_limits(runner)
        self.settings = settings or VerifierSettings()
        compile_target(runner, self.settings.compile)
        self.engine = VerifyEngine(runner, self.settings.kv_tokens, self.settings.invariant,
                                   self.settings.share_prefixes)
        warm_up(self.engine, logging.getLogger("verifier").info)  # nothing when not compiled
        metrics.VERIFIER_INVARIANT.set(int(self.engine.invariance_verified))
        logging.getLogger("verifier").info(
            "passes: %s", f"batch-invariant, {self.engine.invariance}"
            if self.settings.invariant else "plain (--no-invariant)")
        self.planner = DraftPlanner(step_cost or load_or_profile(  # cached, else ~15 s
            runner, seconds=PROFILE_SECONDS, invariant=self.settings.invariant))
        self.scheduler = StepScheduler(self.engine, executor, self.settings, self.planner)
        self.sessions: dict[str, OpenSession] = {}
        self.highest_epoch = EpochMemory()
        self.admission = Admission(self.engine, self.settings.admission_wait_s,
                                   self.settings.max_kv_share, lambda: bool(self.sessions))

    @property
    def num_active(self) -> int:
        return len(self.sessions)

    async def open(self, msg: verifier_pb2.SessionOpen) -> OpenSession:
        """Checks every field (RequestInvalid), then reserves the session's KV memory."""
        settings = session_settings(msg, self.limits)
        check_feature_layers(msg.feature_layers, self.limits.num_layers)
        check_tree_nodes(msg.tree_nodes)
        check_scope(msg.prefix_scope, "prefix_scope")
        self._check_epoch(msg.session_id, msg.epoch)
        sequence = await self.admission.admit(lambda: SequenceVerifier(
            self.runner, list(msg.context_tokens), settings.sampling, msg.prompt_len,
            settings.policy, self.engine, tree_room=msg.tree_nodes,
            prefix_scope=msg.prefix_scope), msg.prefix_scope,
            len(msg.context_tokens) + msg.tree_nodes + 1)
        try:
            self._check_epoch(msg.session_id, msg.epoch)  # a newer owner may have come meanwhile
        except StaleEpoch:
            sequence.close()
            raise
        sequence.feature_layers = tuple(msg.feature_layers)
        if msg.plan_drafts:
            self.planner.enroll(sequence, msg.draft_method or DEFAULT_DRAFT_METHOD,
                                shadowed=msg.shadow_drafts and sequence.params.is_greedy,
                                tree=msg.tree_nodes > 0,
                                most=_longest_block(msg),
                                regime=sampling_regime(sequence.params, sequence.policy))
        session = OpenSession(msg.session_id, msg.epoch, sequence, trace_context=current_context())
        self.highest_epoch.opened(msg.session_id, msg.epoch)
        self.sessions[msg.session_id] = session
        self._observe_memory()
        return session

    def _check_epoch(self, session_id: str, epoch: int) -> None:
        seen = self.highest_epoch.get(session_id, 0)
        if epoch < seen:
            raise StaleEpoch(f"session {session_id}: epoch {epoch} < current {seen}")

    def _observe_memory(self) -> None:
        metrics.VERIFIER_SESSIONS.set(len(self.sessions))
        metrics.KV_CACHE_USAGE.set(self.engine.store.usage)

    async def open_replies(self, session: OpenSession) -> list[verifier_pb2.Verdict]:
        """For a session that asked for features: the context's features (prefilled on the
        model thread), in verdicts that commit nothing."""
        sequence = session.sequence
        features = await self.scheduler.submit(sequence, None)
        nothing = RoundOutcome(0, [], len(sequence.committed))
        return [verdict_to_pb(nothing, 0, chunk, session_id=session.session_id,
                              epoch=session.epoch)
                for chunk in context_feature_chunks(features, len(sequence.committed))]

    def plan_reply(self, session: OpenSession) -> verifier_pb2.Verdict:
        """For a planned session: a verdict that commits nothing and says how long its first
        block should be (0: the verifier decodes it alone from the start)."""
        length = self.planner.first_length(session.sequence, max(len(self.sessions), 1))
        return verifier_pb2.Verdict(session_id=session.session_id, epoch=session.epoch,
                                    committed_len=len(session.sequence.committed),
                                    next_draft_tokens=length)

    def shadow(self, session: OpenSession, msg: verifier_pb2.ShadowBlock) -> None:
        """A shadow block from the session's drafter (verifier.proto): checked, then scored by
        the planner against the committed tokens; one of an older epoch or of a sampled
        session (where equality is not the acceptance rule) is ignored."""
        check_shadow(msg, self.limits.vocab_size, len(session.sequence.committed))
        if msg.epoch == session.epoch and session.sequence.params.is_greedy:
            self.planner.shadow(session.sequence, msg.base_len, list(msg.tokens),
                                list(msg.parents) or None)

    def ready(self, session: OpenSession, msg: verifier_pb2.DraftReady) -> None:
        """The session's drafter has a draft ready while it is decoded alone (verifier.proto):
        the planner's next verdict asks for it; one of an older epoch is ignored."""
        if msg.epoch == session.epoch:
            self.planner.ready(session.sequence, min(msg.num_tokens, MAX_DRAFT_TOKENS))

    async def close(self, session: OpenSession) -> None:
        """Forget the session when its stream ends; its KV memory is given back on the model
        thread, after any step that holds its row (a release under a running step failed the
        whole step), and waiting opens are woken. Done even if the caller is cancelled."""
        self.planner.release(session.sequence)
        if self.sessions.get(session.session_id) is session:
            del self.sessions[session.session_id]
            self.highest_epoch.closed(session.session_id)
        await asyncio.shield(asyncio.ensure_future(self._release(session.sequence)))

    async def _release(self, sequence: SequenceVerifier) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self.scheduler.executor,
                                                             sequence.close)
        except RuntimeError:  # the executor shut down (the pod stops): no step runs any more
            sequence.close()
        self._observe_memory()
        await self.admission.freed()

    def _is_stale(self, session: OpenSession, block: verifier_pb2.DraftBlock) -> bool:
        current = self.highest_epoch.get(session.session_id, 0)
        return (block.session_id != session.session_id or block.epoch != session.epoch
                or session.epoch < current or block.base_len != len(session.sequence.committed))

    def catches_up(self, session: OpenSession) -> bool:
        """Whether to decode ``session`` alone while its next block is on its way."""
        return catches_up(self.planner, session, self.sessions.values())

    def awaits_block(self, session: OpenSession) -> bool:
        """Whether ``session`` is caught up while the block it was asked for is on its way."""
        return self.planner.is_awaiting(session.sequence)

    async def catch_up(self, session: OpenSession, round_number: int) -> verifier_pb2.Verdict:
        """One round of ``session`` decoded alone while its next block is on its way."""
        if not self.awaits_block(session):
            session.asked_by = session.last_verdict
        self.planner.await_block(session.sequence)  # its plan stands until the block
        block = session.undrafted(round_number)
        verdict = await self._answer(session, block, draft_from_pb(block, self.limits.vocab_size))
        verdict.catching_up = True
        verdict.ClearField("next_draft_tokens")
        metrics.CAUGHT_UP_ROUNDS.inc()
        return verdict

    async def verify(self, session: OpenSession, block: verifier_pb2.DraftBlock
                     ) -> verifier_pb2.Verdict | None:
        """The block's verdict, or None for a block sent ahead on a wrong guess, or one on its
        way when rounds decoded alone meanwhile ended the generation (dropped). A block the
        session awaited while rounds were decoded alone (``catch_up``) is verified from where
        those rounds left it."""
        draft = draft_from_pb(block, self.limits.vocab_size)  # checks the block first
        if self.planner.is_awaiting(session.sequence):  # rounds caught up since it was asked
            if block.HasField("assumes"):  # sent ahead: the awaited block if its guess is right
                if not guessed_right(session, block, session.asked_by):
                    metrics.SSD_DROPPED_BLOCKS.inc()
                    return None
                block = untagged(block)
            if session.sequence.is_finished:
                return None  # it was on its way when the generation ended: dropped
            if (block.epoch == session.epoch and not block.parents
                    and block.base_len < len(session.sequence.committed)):
                block = rebased(self.planner, session, block)
                draft = draft_from_pb(block, self.limits.vocab_size)
            self.planner.block_came(session.sequence)
        if assumed_outcome(block) is not None and not guessed_right(session, block,
                                                                    session.last_verdict):
            metrics.SSD_DROPPED_BLOCKS.inc()
            return None
        return await self._answer(session, block, draft)

    async def _answer(self, session: OpenSession, block: verifier_pb2.DraftBlock, draft: Draft
                      ) -> verifier_pb2.Verdict:
        """The verdict of a block not dropped: the last one again for a resent block, a stale
        one for another epoch or base, else the scheduler's."""
        if (block.epoch == session.epoch and block.round == session.last_round
                and session.last_verdict):
            return session.last_verdict  # a resent block: answer again, change nothing
        if self._is_stale(session, block):
            return self._stale(session, block)
        self.planner.drafted(session.sequence, block.draft_us / 1e6, draft.num_tokens,
                             block.predrafted or assumed_outcome(block) is not None)
        with start_span("verify", session.trace_context, session_id=session.session_id,
                        round=block.round, num_draft=draft.num_tokens) as span:
            started = time.perf_counter()  # the scheduler's next step, batched with others
            outcome = await self.scheduler.submit(session.sequence, draft)
            seconds = time.perf_counter() - started
            span.set_attribute("num_accepted", outcome.num_accepted)
        note = self.planner.note(session.sequence)
        verified = note.num_verified if note is not None else draft.num_tokens
        metrics.VERIFY_SECONDS.observe(seconds)
        metrics.VERIFIER_SPEC_STATS.observe(verified, outcome.num_accepted, len(outcome.tokens),
                                            outcome.num_deferred, outcome.num_forced,
                                            outcome.num_filled)
        session.last_round = block.round
        session.last_verdict = verdict_to_pb(outcome, int(seconds * 1e6),
                                             session.sequence.last_features,
                                             session_id=session.session_id, epoch=session.epoch,
                                             round=block.round)
        if note is not None:
            session.last_verdict.num_verified = note.num_verified
            session.last_verdict.next_draft_tokens = note.next_draft_tokens
        return session.last_verdict

    def _stale(self, session: OpenSession, block: verifier_pb2.DraftBlock) -> verifier_pb2.Verdict:
        return verifier_pb2.Verdict(
            session_id=block.session_id, epoch=block.epoch, round=block.round, is_stale=True,
            committed_len=len(session.sequence.committed))


def _longest_block(msg: verifier_pb2.SessionOpen) -> int:
    """The longest block a planned session's drafter drafts (0: unknown), within the bounds
    any block is held to."""
    if msg.tree_nodes:
        return min(msg.tree_nodes, MAX_TREE_NODES)
    return min(msg.num_draft_tokens, MAX_DRAFT_TOKENS)

