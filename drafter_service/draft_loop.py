"""One session on a drafter: draft a block, stream it to the verifier, apply the verdict, and
relay the round to the gateway.

The proposer keeps its own per-sequence state in step with the committed tokens (the model
proposer's cache follows them by position), so applying a verdict is just extending the committed
list; the rejected tail is rolled back on the next proposal. With speculation on
(``drafter_service.speculation``) the drafter pre-drafts for guessed outcomes while it waits for
each verdict (``drafter_service.predrafts``), and may send some of those blocks ahead; sending
and receiving are then independent (``VerifierStream`` keeps injected delay from holding up the
loop). Pre-drafted blocks say so (``DraftBlock.predrafted``): the verifier did not wait for
their drafting.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor

import grpc

from cascade.core.blocks import Draft
from cascade.core.proposers import ProposerContext, new_proposer
from cascade.core.model.runner import ModelRunner
from cascade.core.memory.suffix_index import SessionMemory
from cascade.pod.messages import (
    draft_to_pb,
    ends_generation,
    features_from_pb,
    num_open_replies,
    tokens_after,
)
from cascade.protocol.settings import DraftConfig
from cascade.protocol.validation import SessionSettings
from cascade.serving import metrics
from cascade.serving.delay import LinkDelay
from cascade.serving.telemetry import current_context, start_span
from cascade.v1 import common_pb2, drafter_pb2, verifier_pb2
from drafter_service.predrafts import PreDrafter
from drafter_service.relay import EMPTY_BLOCK, UNDRAFTED, relayed_round
from drafter_service.shadows import Shadows
from drafter_service.speculation import SpeculationCache, SpeculationConfig
from drafter_service.verifier_stream import VerifierStream


def _micros(since: float) -> int:
    return int((time.perf_counter() - since) * 1e6)


class DraftLoop:
    def __init__(self, runner: ModelRunner, executor: Executor,
                 request: drafter_pb2.RunSessionRequest, settings: SessionSettings,
                 config: DraftConfig, delay: LinkDelay = LinkDelay(),
                 speculation: SpeculationConfig = SpeculationConfig(),
                 num_sessions: Callable[[], int] = lambda: 1,
                 memory: SessionMemory | None = None) -> None:
        """``settings`` and ``config``: what the request carries, checked by the servicer;
        ``delay``: injected network delay to the verifier (cascade.serving.delay);
        ``speculation``: drafting during verification (off for proposers that cannot), in
        rounds that start while ``num_sessions()`` is at most its ``max_sessions``;
        ``memory``: the speculation memory under the session's scope (None: off)."""
        self.request = request
        self.link = delay.for_session(request.session_id)
        self.params, self.config = settings.sampling, config
        self.proposer = new_proposer(ProposerContext(runner, self.params, self.config,
                                                     settings.policy, request.prompt_len,
                                                     memory, request.prefix_scope))
        self.speculation = speculation if self.proposer.can_speculate else SpeculationConfig()
        self.predrafts = PreDrafter(self.proposer, executor, self.speculation, self.params,
                                    request.prompt_len, self._budget, self._predrafted_block)
        self.num_sessions = num_sessions
        self.executor = executor
        self.committed = list(request.context_tokens)
        self.trace_context = current_context()  # the RunSession span: parent of each `draft`
        self.planned_length: int | None = None
        """The verifier's plan for the next block's length (planned sessions; None: k)."""
        self.latest: verifier_pb2.Verdict | None = None
        """The last verdict of a round the verifier decoded alone (None: none yet)."""
        self._last = time.perf_counter()
        """When the last round was relayed (or the session opened)."""

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

    def _observe(self, verdict: verifier_pb2.Verdict) -> None:
        """Hand the verdict's target features to the proposer (never while it drafts); take
        the verifier's plan for the next block's length."""
        if verdict.HasField("features"):
            self.proposer.observe(features_from_pb(verdict.features))
        if verdict.HasField("next_draft_tokens"):
            self.planned_length = self.proposer.planned = verdict.next_draft_tokens

    def _budget(self, context: list[int]) -> int:
        """Tokens worth drafting after ``context`` (the committed tokens, or a guess of them),
        at most what the verifier's plan asks for."""
        budget = self.config.budget(self.params, len(context) - self.request.prompt_len)
        if self.planned_length is None or self.proposer.drafts_past_plan:
            return budget
        return min(budget, self.planned_length)

    def _block(self, draft: Draft, round_number: int, context: list[int], draft_us: int
               ) -> verifier_pb2.DraftBlock:
        return draft_to_pb(draft, session_id=self.request.session_id, epoch=self.request.epoch,
                           round=round_number, base_len=len(context), draft_us=draft_us)

    def _predrafted_block(self, draft: Draft, round_number: int, context: list[int],
                          draft_us: int) -> verifier_pb2.DraftBlock:
        block = self._block(draft, round_number, context, draft_us)
        block.predrafted = True  # drafted while the verifier verified the round before
        return block

    async def _draft(self, round_number: int, context: list[int], most: int = 0
                     ) -> verifier_pb2.DraftBlock:
        """A block after ``context``, the committed tokens (at most ``most`` tokens, if set)."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        budget = min(self._budget(context), most) if most else self._budget(context)
        with start_span("draft", self.trace_context, session_id=self.request.session_id,
                        round=round_number) as span:
            draft = await loop.run_in_executor(
                self.executor, self.proposer.propose, context, budget)
            span.set_attribute("num_draft", draft.num_tokens)
        metrics.DRAFT_SECONDS.observe(time.perf_counter() - started)
        return self._block(draft, round_number, context, _micros(started))

    async def run(self, channel: grpc.aio.Channel, timeout: float | None
                  ) -> AsyncIterator[common_pb2.Round]:
        stream = VerifierStream(channel, timeout, self.link, self.request.session_id)
        try:
            await stream.send(self._open_message())
            async for relayed in self._opening(stream):
                yield relayed
            if self.latest is None or not ends_generation(self.latest):
                async for relayed in self._rounds(stream):
                    yield relayed
            await stream.finish()
        finally:
            stream.close()

    async def _opening(self, stream: VerifierStream) -> AsyncIterator[common_pb2.Round]:
        """The verifier's replies to the open: the context's target features (a feature
        drafter), the plan for the first block (a planned session), and the rounds it decodes
        alone if that plan is 0."""
        if self.proposer.wants_target_features:  # the context's features come first
            for _ in range(num_open_replies(len(self.committed))):
                self._observe(await stream.receive())
        if self.config.planned:  # the verifier's plan for the first block comes next
            self._observe(await stream.receive())
        self._last = time.perf_counter()  # the first round starts now
        if self.planned_length == 0:  # the plan: it decodes alone from the start
            async for relayed in self._alone(stream):
                yield relayed

    async def _rounds(self, stream: VerifierStream) -> AsyncIterator[common_pb2.Round]:
        """Block, verdict and relayed round, again and again until the generation ends."""
        first_round = self.latest.round + 1 if self.latest is not None else 0
        block = await self._draft(first_round, self.committed)
        await stream.send(verifier_pb2.VerifyRequest(block=block))
        sent = time.perf_counter()
        origin = (common_pb2.SPECULATION_MISS if self.speculation.is_on
                  else common_pb2.SPECULATION_UNSPECIFIED)
        while True:
            verdict, cache = await self._await_verdict(stream, block)
            base = len(self.committed)
            while verdict.catching_up:  # decoded alone while the block was on its way
                self.committed.extend(verdict.tokens)
                yield self._relay(verdict, EMPTY_BLOCK, UNDRAFTED, None)
                cache = None  # its pre-drafts were made for another base
                if ends_generation(verdict):
                    return  # the generation ended before the block came
                verdict = await stream.receive()
            self._observe(verdict)
            if len(self.committed) > base:  # the verifier took the block from there
                block = verifier_pb2.DraftBlock(
                    tokens=tokens_after(block, self.committed[block.base_len:]),
                    draft_us=block.draft_us, source=block.source)
            self.committed.extend(verdict.tokens)
            self._judged(verdict, block, sent)
            yield self._relay(verdict, block, origin, cache)
            if self.planned_length == 0 and not ends_generation(verdict):
                async for relayed in self._alone(stream):  # the verifier decodes alone
                    yield relayed
                verdict, cache = self.latest, None  # pre-drafts from before are out of date
            if ends_generation(verdict):
                return
            block, origin = await self._next_block(stream, verdict, cache)
            sent = time.perf_counter()

    def _judged(self, verdict: verifier_pb2.Verdict, block: verifier_pb2.DraftBlock,
                sent: float) -> None:
        """Tell the proposer how its block fared and what the round cost (``RoundCosts``)."""
        self.proposer.costs.observe("round_s", time.perf_counter() - sent)
        verified = (verdict.num_verified if verdict.HasField("num_verified")
                    else len(block.tokens))
        self.proposer.judged(block.source, verified, verdict.stats.num_accepted)

    def _relay(self, verdict: verifier_pb2.Verdict, block: verifier_pb2.DraftBlock,
               origin: common_pb2.Speculation, cache: SpeculationCache | None
               ) -> common_pb2.Round:
        """The round to relay for ``verdict`` (``relayed_round``), timed from the last one."""
        relayed = relayed_round(verdict, block, origin, cache, _micros(self._last))
        self._last = time.perf_counter()
        return relayed

    async def _alone(self, stream: VerifierStream) -> AsyncIterator[common_pb2.Round]:
        """The rounds the verifier decodes alone (``_follow``), relayed; ``latest``: the last
        verdict."""
        async for verdict in self._follow(stream):
            self.latest = verdict
            yield self._relay(verdict, EMPTY_BLOCK, UNDRAFTED, None)

    async def _follow(self, stream: VerifierStream
                      ) -> AsyncIterator[verifier_pb2.Verdict]:
        """The verdicts of rounds the verifier decodes alone (the plan asked for 0 drafted
        tokens), until one asks for drafts again or ends the generation; shadow blocks
        meanwhile, where they are exact (drafter_service.shadows); and a draft-ready note as
        soon as the proposer has a draft it expects to pay (the speculation memory matched)."""
        shadows = self._shadows(stream)
        noted = False
        last = time.perf_counter()
        try:
            while True:
                verdict = await stream.receive()
                self.proposer.costs.observe("alone_s", time.perf_counter() - last)
                last = time.perf_counter()
                self._observe(verdict)
                self.committed.extend(verdict.tokens)
                if shadows is not None:
                    shadows.after(self.committed)
                if not noted and not ends_generation(verdict):
                    noted = await self._note_ready(stream)
                yield verdict
                if self.planned_length != 0 or ends_generation(verdict):
                    return
        finally:
            if shadows is not None:
                await shadows.stop()

    async def _note_ready(self, stream: VerifierStream) -> bool:
        """Tell the verifier (decoding the session alone) that a draft it should verify is
        ready, if the proposer has one; returns whether it did."""
        num_tokens = self.proposer.ready(self.committed)
        if num_tokens:
            await stream.send(verifier_pb2.VerifyRequest(ready=verifier_pb2.DraftReady(
                epoch=self.request.epoch, num_tokens=num_tokens)))
        return num_tokens > 0

    @property
    def _shadows_exact(self) -> bool:
        """Shadow blocks score exactly in a greedy session (a draft is accepted while it equals
        the committed tokens) whose proposer drafts from tokens alone (no target features) and
        has a shadow drafter (``Proposer.shadow_propose``: not the memory's drafts, which say
        when they are ready instead)."""
        return (self.params.is_greedy and not self.proposer.wants_target_features
                and self.proposer.shadow_propose() is not None)

    def _shadows(self, stream: VerifierStream) -> Shadows | None:
        if not self._shadows_exact:
            return None
        return Shadows(self.proposer.shadow_propose(), self.executor, stream.send,
                       self.request.epoch, self.config.num_draft_tokens, self.num_sessions,
                       self.request.prompt_len + self.config.num_draft_tokens,
                       budget=self.config.tree_nodes)

    async def _next_block(self, stream: VerifierStream, verdict: verifier_pb2.Verdict,
                          cache: SpeculationCache | None
                          ) -> tuple[verifier_pb2.DraftBlock, common_pb2.Speculation]:
        """The block after ``verdict``: from the speculation cache, or drafted now; sent to the
        verifier unless it went ahead already."""
        block, origin = (cache.lookup(verdict) if cache is not None
                         else (None, common_pb2.SPECULATION_UNSPECIFIED))
        if cache is not None:
            metrics.SSD_ROUNDS.labels(common_pb2.Speculation.Name(origin)).inc()
            metrics.SSD_WASTED.inc(len(cache.blocks) - (block is not None))
        if block is None:
            most = self.speculation.miss_tokens if cache is not None else 0
            block = await self._draft(verdict.round + 1, self.committed, most)
        if origin != common_pb2.SPECULATION_AHEAD_HIT:
            await stream.send(verifier_pb2.VerifyRequest(block=block))
        return block, origin

    async def _await_verdict(self, stream: VerifierStream, block: verifier_pb2.DraftBlock
                             ) -> tuple[verifier_pb2.Verdict, SpeculationCache | None]:
        """The block's verdict; with speculation on, pre-drafts made while it was verified."""
        if (not self.speculation.is_on or self.num_sessions() > self.speculation.max_sessions
                or self.planned_length == 0):  # nothing to pre-draft: the verifier decodes
            return await stream.receive(), None
        cache, stop = SpeculationCache(), threading.Event()
        verdict = asyncio.ensure_future(stream.receive())
        verdict.add_done_callback(lambda _: stop.set())
        try:
            await self.predrafts.speculate(block, list(self.committed), cache, stream.send,
                                           stop)
            return await verdict, cache
        finally:
            verdict.cancel()
