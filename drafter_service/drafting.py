"""How one session's blocks are made on a drafter: drafted on the model thread when the session
asks (``cascade.session.events.Draft``), or taken from the pre-drafts made while the last block
was verified (``drafter_service.predrafts``; the cache is filled while the pump waits for a
verdict, ``receive``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor

from cascade.core.blocks import Draft
from cascade.core.proposers import EstimatesOwnDrafts, Proposer
from cascade.pod.messages import draft_to_pb
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.serving import metrics
from cascade.serving.telemetry import start_span
from cascade.session import actions as act
from cascade.session import events as ev
from cascade.v1 import common_pb2, drafter_pb2, verifier_pb2
from drafter_service.predrafts import PreDrafter
from drafter_service.speculation import SpeculationCache, SpeculationConfig
from drafter_service.verifier_stream import VerifierStream


def micros(since: float) -> int:
    return int((time.perf_counter() - since) * 1e6)


class Drafting:
    def __init__(self, proposer: Proposer, executor: Executor,
                 request: drafter_pb2.RunSessionRequest, params: SamplingParams,
                 config: DraftConfig, speculation: SpeculationConfig,
                 planned: Callable[[], int | None], num_sessions: Callable[[], int],
                 trace_context=None) -> None:
        """``planned``: the verifier's plan for the next block's length (None: none);
        ``num_sessions``: sessions on the pod now (pre-drafting stops past
        ``speculation.max_sessions``); ``trace_context``: parent of each ``draft`` span."""
        self.proposer, self.executor, self.request = proposer, executor, request
        self.params, self.config, self.speculation = params, config, speculation
        self.planned, self.num_sessions = planned, num_sessions
        self.trace_context = trace_context
        self.predrafts = PreDrafter(proposer, executor, speculation, params,
                                    request.prompt_len, self.budget, self._predrafted_block)
        self.cache: SpeculationCache | None = None
        """The pre-drafts made while the last block was verified (None: none)."""

    def budget(self, context: list[int]) -> int:
        """Tokens worth drafting after ``context`` (the committed tokens, or a guess of them),
        at most what the verifier's plan asks for."""
        budget = self.config.budget(self.params, len(context) - self.request.prompt_len)
        planned = self.planned()
        if planned is None or isinstance(self.proposer, EstimatesOwnDrafts):
            return budget
        return min(budget, planned)

    def _block(self, draft: Draft, round_number: int, context: list[int], draft_us: int
               ) -> verifier_pb2.DraftBlock:
        return draft_to_pb(draft, session_id=self.request.session_id, epoch=self.request.epoch,
                           round=round_number, base_len=len(context), draft_us=draft_us)

    def _predrafted_block(self, draft: Draft, round_number: int, context: list[int],
                          draft_us: int) -> verifier_pb2.DraftBlock:
        block = self._block(draft, round_number, context, draft_us)
        block.predrafted = True  # drafted while the verifier verified the round before
        return block

    async def next_block(self, action: act.Draft) -> ev.Drafted:
        """The block ``action`` asks for: from the pre-drafts for what ``action.after``
        decided, or drafted now (on a miss, at most ``miss_tokens``)."""
        block, origin, cache = None, action.origin, None
        if action.after is not None and self.cache is not None:
            cache = self.cache
            block, origin = cache.lookup(action.after)
            metrics.SSD_ROUNDS.labels(common_pb2.Speculation.Name(origin)).inc()
            metrics.SSD_WASTED.inc(len(cache.blocks) - (block is not None))
        if block is None:
            most = self.speculation.miss_tokens if cache is not None else 0
            block = await self._draft(action.round, action.context, most)
        return ev.Drafted(block, origin)

    async def _draft(self, round_number: int, context: list[int], most: int = 0
                     ) -> verifier_pb2.DraftBlock:
        """A block after ``context``, the committed tokens (at most ``most`` tokens, if set)."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        budget = min(self.budget(context), most) if most else self.budget(context)
        with start_span("draft", self.trace_context, session_id=self.request.session_id,
                        round=round_number) as span:
            draft = await loop.run_in_executor(
                self.executor, self.proposer.propose, context, budget)
            span.set_attribute("num_draft", draft.num_tokens)
        metrics.DRAFT_SECONDS.observe(time.perf_counter() - started)
        return self._block(draft, round_number, context, micros(started))

    async def receive(self, stream: VerifierStream, block: verifier_pb2.DraftBlock | None,
                      committed: list[int]) -> verifier_pb2.Verdict:
        """The verifier's next message; pre-drafts for the outcomes of ``block`` (drafted after
        ``committed``) meanwhile, into ``cache``, unless None or the pod runs too many sessions
        to spend its model thread."""
        self.cache = None
        if block is None or self.num_sessions() > self.speculation.max_sessions:
            return await stream.receive()
        cache, stop = SpeculationCache(), threading.Event()
        verdict = asyncio.ensure_future(stream.receive())
        verdict.add_done_callback(lambda _: stop.set())
        try:
            await self.predrafts.speculate(block, list(committed), cache, stream.send, stop)
            received = await verdict
        finally:
            verdict.cancel()
        self.cache = cache
        return received
