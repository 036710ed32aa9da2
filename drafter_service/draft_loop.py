"""One session on a drafter: the pump around ``cascade.session.DrafterSession``.

The machine decides (what to send, draft, relay, when the verifier decodes alone); the pump
performs its actions: drafts on the model thread, writes and reads the Verify stream, relays
rounds to the gateway, and feeds back what each returns. The proposer keeps its own
per-sequence state in step with the committed tokens (the model proposer's cache follows them by
position), so a verdict only extends the committed list; the rejected tail is rolled back on the
next proposal. With speculation on (``drafter_service.speculation``) the pump pre-drafts for
guessed outcomes while it waits for a verdict (``drafter_service.predrafts``), and may send some
of those blocks ahead; pre-drafted blocks say so (``DraftBlock.predrafted``): the verifier did
not wait for their drafting. While the verifier decodes the session alone, shadow blocks go out
(``drafter_service.shadows``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor

import grpc

from cascade.core.memory.suffix_index import SessionMemory
from cascade.core.model.runner import ModelRunner
from cascade.core.proposers import (
    EstimatesOwnDrafts,
    ProposerContext,
    guesser,
    new_proposer,
    shadow_drafter,
)
from cascade.pod.messages import features_from_pb
from cascade.protocol.settings import DraftConfig
from cascade.protocol.wire.validation import SessionSettings
from cascade.serving.mesh.delay import LinkDelay
from cascade.serving.errors import StaleEpoch
from cascade.serving.telemetry import current_context
from cascade.session import actions as act
from cascade.session import events as ev
from cascade.session.drafter import DrafterSession
from cascade.session.wire import num_open_replies, num_verified
from cascade.v1 import common_pb2, drafter_pb2, verifier_pb2
from drafter_service.drafting import Drafting, micros
from drafter_service.relay import relayed_round
from drafter_service.shadows import Shadows
from drafter_service.speculation import SpeculationConfig
from drafter_service.verifier_stream import VerifierStream


class DraftLoop:
    def __init__(self, runner: ModelRunner, executor: Executor,
                 request: drafter_pb2.RunSessionRequest, settings: SessionSettings,
                 config: DraftConfig, delay: LinkDelay = LinkDelay(),
                 speculation: SpeculationConfig = SpeculationConfig(),
                 num_sessions: Callable[[], int] = lambda: 1,
                 memory: SessionMemory | None = None) -> None:
        """``settings`` and ``config``: what the request carries, checked by the servicer;
        ``delay``: injected network delay to the verifier (cascade.serving.mesh.delay);
        ``speculation``: drafting during verification (off for proposers that cannot), in
        rounds that start while ``num_sessions()`` is at most its ``max_sessions``;
        ``memory``: the speculation memory under the session's scope (None: off)."""
        self.request = request
        self.link = delay.for_session(request.session_id)
        self.params, self.config = settings.sampling, config
        self.proposer = new_proposer(ProposerContext(runner, self.params, self.config,
                                                     settings.policy, request.prompt_len,
                                                     memory, request.prefix_scope))
        self.speculation = (speculation if guesser(self.proposer) is not None
                            else SpeculationConfig())
        self.num_sessions, self.executor = num_sessions, executor
        wants_features = self.proposer.wants_target_features
        self.session = DrafterSession(
            self._open_message(), list(request.context_tokens),
            open_replies=num_open_replies(len(request.context_tokens)) if wants_features else 0,
            planned=config.planned, speculates=self.speculation.is_on)
        self.drafting = Drafting(self.proposer, executor, request, self.params, config,
                                 self.speculation, lambda: self.session.planned_length,
                                 num_sessions, current_context())  # the RunSession span
        self.shadows: Shadows | None = None
        self._last = self._sent = self._alone_since = time.perf_counter()
        """When the last round was relayed, the block was sent, the last round alone came."""

    def _open_message(self) -> verifier_pb2.VerifyRequest:
        r = self.request
        layers = self.proposer.feature_layers if self.proposer.wants_target_features else ()
        return verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(
            session_id=r.session_id, epoch=r.epoch, context_tokens=r.context_tokens,
            prompt_len=r.prompt_len, sampling=r.sampling, acceptance=r.acceptance,
            feature_layers=layers, owner_tag=r.owner_tag, plan_drafts=self.config.planned,
            draft_method=self.config.method, tree_nodes=self.config.tree_nodes,
            num_draft_tokens=self.config.longest_block, prefix_scope=r.prefix_scope,
            shadow_drafts=self.config.planned and self._shadows_exact))

    async def run(self, channel: grpc.aio.Channel, timeout: float | None
                  ) -> AsyncIterator[common_pb2.Round]:
        """The session's rounds, relayed: the machine's actions performed, what they return
        fed back, until it has none left."""
        stream = VerifierStream(channel, timeout, self.link)
        try:
            actions = self.session.start()
            while actions:
                answers = []
                for action in actions:
                    if isinstance(action, act.Relay):
                        yield self._relay(action)
                    elif (answer := await self._perform(action, stream)) is not None:
                        answers.append(answer)
                actions = [then for answer in answers for then in self.session.on(answer)]
        finally:
            await self._stop_alone()
            stream.close()

    async def _perform(self, action, stream: VerifierStream):
        """Do ``action``; returns the event it answers with (None: none)."""
        match action:
            case act.Send(request):
                await stream.send(request)
            case act.Draft():
                drafted = await self.drafting.next_block(action)
                self._sent = time.perf_counter()
                return drafted
            case act.Receive(block):
                return ev.classify(await self.drafting.receive(stream, block,
                                                               self.session.committed))
            case act.Observe(msg):
                self._observe(msg)
            case act.Judge(msg, block):
                self.proposer.costs.observe("round_s", time.perf_counter() - self._sent)
                self.proposer.judged(block.source, num_verified(msg, block),
                                     msg.stats.num_accepted)
            case act.Begin():
                self._last = time.perf_counter()
            case act.StartAlone():
                self.shadows, self._alone_since = self._shadows(stream), time.perf_counter()
            case act.Follow(committed):
                self._follow(committed)
            case act.OfferReady(committed):
                return await self._offer_ready(stream, committed)
            case act.StopAlone():
                await self._stop_alone()
            case act.Finish():
                await stream.finish()
            case act.Fail(reason):
                raise StaleEpoch(f"session {self.request.session_id}: {reason}")
            case _:
                raise TypeError(f"no such action: {action!r}")
        return None

    def _observe(self, verdict: verifier_pb2.Verdict) -> None:
        """Hand the verdict's target features to the proposer (never while it drafts) and the
        verifier's plan for the next block's length."""
        if verdict.HasField("features"):
            self.proposer.observe(features_from_pb(verdict.features))
        if verdict.HasField("next_draft_tokens"):
            self.proposer.planned = verdict.next_draft_tokens

    def _relay(self, action: act.Relay) -> common_pb2.Round:
        """The round to relay (``relayed_round``), timed from the last one."""
        cache = self.drafting.cache if action.predrafted else None
        relayed = relayed_round(action.msg, action.block, action.origin, cache,
                                micros(self._last))
        self._last = time.perf_counter()
        return relayed

    def _follow(self, committed: list[int]) -> None:
        """A round decoded alone came: its time, and the shadows go on after it."""
        self.proposer.costs.observe("alone_s", time.perf_counter() - self._alone_since)
        self._alone_since = time.perf_counter()
        if self.shadows is not None:
            self.shadows.after(committed)

    async def _offer_ready(self, stream: VerifierStream, committed: list[int]
                           ) -> ev.ReadyNoted | None:
        """Tell the verifier (decoding the session alone) that a draft it should verify is
        ready, if the proposer has one (the speculation memory matched)."""
        if not isinstance(self.proposer, EstimatesOwnDrafts):
            return None
        num_tokens = self.proposer.ready(committed)
        if not num_tokens:
            return None
        await stream.send(ev.ready_request(self.request.epoch, num_tokens))
        return ev.ReadyNoted()

    @property
    def _shadows_exact(self) -> bool:
        """Shadow blocks score exactly in a greedy session (a draft is accepted while it equals
        the committed tokens) whose proposer drafts from tokens alone (no target features) and
        has a shadow drafter (``shadow_drafter``: not the memory's drafts, which say when they
        are ready instead)."""
        return (self.params.is_greedy and not self.proposer.wants_target_features
                and shadow_drafter(self.proposer) is not None)

    def _shadows(self, stream: VerifierStream) -> Shadows | None:
        drafter = shadow_drafter(self.proposer)
        if drafter is None or not self._shadows_exact:
            return None
        return Shadows(drafter, self.executor, stream.send,
                       self.request.epoch, self.config.num_draft_tokens, self.num_sessions,
                       self.request.prompt_len + self.config.num_draft_tokens,
                       budget=self.config.tree_nodes)

    async def _stop_alone(self) -> None:
        if self.shadows is not None:
            shadows, self.shadows = self.shadows, None
            await shadows.stop()
