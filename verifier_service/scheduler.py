"""The verifier's scheduler: blocks from every session queue, the model thread takes them in
batches.

Whenever the model thread is free, the scheduler takes queued items in arrival order (FIFO: one
priority class, so no session can starve) until the next one would push the batch past
``max_batch_tokens`` (an item larger than that on its own, such as a long prompt's prefill, goes
alone), and runs them as one engine step. Before taking a batch it waits, at most
``max_wait_ms``, for the sessions of the previous step that are still running to send their next
block (a target-only session does so at once, a drafter after drafting): without that wait the
first session back would take the model alone and the others would queue behind it, and the
batches would fragment into ones and twos. It does not wait for sessions the draft planner sent
to draft while others come back at once: those join the step after. With batching off every
item is a step of its own, which is how the verifier worked before the engine (the benchmark's
baseline).

A caller that gives up (its stream was cancelled) leaves its item in the queue; the worker drops
it unrun.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass

from cascade.core.blocks import Draft
from cascade.core.verify.compiled import check_mode
from cascade.core.verify.engine import VerifyEngine
from cascade.core.verify.paged_cache import Preempted
from cascade.core.kv.prefix_share import longest_common
from cascade.core.verify.verification import SequenceVerifier
from cascade.serving import metrics
from verifier_service.planner import DraftPlanner


@dataclass(frozen=True)
class VerifierSettings:
    kv_tokens: int | None = None
    """KV budget in tokens (None: derived from the memory available at start-up)."""
    admission_wait_s: float = 10.0
    """How long a session that does not fit waits for memory before RESOURCE_EXHAUSTED."""
    max_batch_tokens: int = 2048
    """Most tokens one engine step feeds (prefills and drafted blocks together)."""
    max_wait_ms: float = 20.0
    """How long a free model thread waits for the last step's sessions to send their next
    blocks before stepping without them."""
    enabled: bool = True
    """False: one item per step (no batching across sessions)."""
    invariant: bool = True
    """The batch-invariant pass (``cascade.core.forward.invariant``): a position's logits do not depend
    on the rest of the pass, so greedy output never depends on k, batching or load."""
    share_prefixes: bool = True
    """A new session takes the prompt prefix a live or ended session of its scope holds
    instead of computing it (``cascade.core.kv.prefix_cache``)."""
    max_kv_share: float = 0.5
    """Most of the KV budget one prefix scope (an API key) may hold while another's sessions
    wait for memory (``verifier_service.admission``)."""
    compile: str = "off"
    """Compile the target's step: off, on, or auto (on a GPU only): ``cascade.core.verify.compiled``."""

    def __post_init__(self) -> None:
        check_mode(self.compile)
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ValueError(f"kv_tokens must be >= 1, got {self.kv_tokens}")
        if self.admission_wait_s < 0:
            raise ValueError(f"admission_wait_s must be >= 0, got {self.admission_wait_s}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if not 0 < self.max_kv_share <= 1:
            raise ValueError(f"max_kv_share must be in (0, 1], got {self.max_kv_share}")


@dataclass
class _Item:
    sequence: SequenceVerifier
    draft: Draft | None
    tokens: int
    future: asyncio.Future


SHARED_PREFIX_WAIT = 32
"""Shortest prompt prefix a new sequence waits one step for, to copy it from another new
sequence of the step instead of computing it alongside."""


class StepScheduler:
    def __init__(self, engine: VerifyEngine, executor: Executor,
                 settings: VerifierSettings | None = None,
                 planner: DraftPlanner | None = None) -> None:
        self.engine, self.executor, self.planner = engine, executor, planner
        self.settings = settings or VerifierSettings()
        self.queue: deque[_Item] = deque()
        self._arrived = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._expected: set[int] = set()
        """ids of the sequences of the last step that have not finished."""
        self._counted = {"queried": 0, "shared": 0, "preempted": 0}
        """The engine's counters as last added to the metrics."""

    async def submit(self, sequence: SequenceVerifier, draft: Draft | None):
        """The engine's result for this item (raises the item's own error)."""
        future = asyncio.get_running_loop().create_future()
        if self.planner is not None:
            self.planner.arrived(sequence, time.perf_counter())
        self.queue.append(_Item(sequence, draft, sequence.pending_tokens(draft), future))
        metrics.VERIFIER_QUEUE_DEPTH.inc()
        self._arrived.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run())
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.queue:
            await self._gather()
            batch = self._take()
            if not batch:
                continue
            metrics.VERIFIER_BATCH_SIZE.observe(len(batch))
            started = time.perf_counter()
            try:
                items = self._planned([(i.sequence, i.draft) for i in batch])
                results = await loop.run_in_executor(self.executor, self.engine.step, items)
            except Exception as exc:  # noqa: BLE001 - a failed step fails its items, not the loop
                results = [exc] * len(batch)
            else:
                self._observe(items, results, started)
            for item, result in zip(batch, results):
                if isinstance(result, Preempted):  # runs again once blocks free
                    self._requeue(item)
                elif not item.future.done():
                    item.future.set_result(result)
            self._expected = self._coming_back([i.sequence for i in batch])
            await asyncio.sleep(0)  # the callers resume and may queue their next items

    def _requeue(self, item: _Item) -> None:
        item.tokens = item.sequence.pending_tokens(item.draft)
        self.queue.append(item)
        metrics.VERIFIER_QUEUE_DEPTH.inc()

    def _coming_back(self, sequences: list) -> set[int]:
        """The sessions of the last step the next one waits for: all that go on, except,
        while others come back at once, those the plan sent to draft (the hold would make
        every session wait for one round trip to a drafter)."""
        going_on = [s for s in sequences if not s.is_finished]
        drafting = {id(s) for s in going_on
                    if self.planner is not None and self.planner.is_drafting(s)}
        quick = {id(s) for s in going_on} - drafting
        return quick or drafting

    def _planned(self, items: list) -> list:
        """The step's (sequence, draft) rows, planned sessions' blocks cut to what pays."""
        if self.planner is None:
            return items
        return [(s, d) for (s, _), d in zip(items, self.planner.plan(items))]

    def _observe(self, items: list, results: list, started: float) -> None:
        """Metrics and the planner's estimates from a step; a fault here is logged, never
        failing the step's items (their tokens are committed)."""
        try:
            self._observe_step(items, results, started)
        except Exception:  # noqa: BLE001
            logging.getLogger("verifier").exception("observing a step failed")

    def _observe_step(self, items: list, results: list, started: float) -> None:
        seconds = time.perf_counter() - started
        metrics.VERIFIER_STEP_SECONDS.observe(seconds)
        self._count_engine()
        if self.planner is not None and not any(isinstance(r, Exception) for r in results):
            self.planner.observe(items, results, seconds)

    def _count_engine(self) -> None:
        """The engine's prefix-cache and preemption counters into the metrics."""
        engine, counted = self.engine, self._counted
        now = {"queried": engine.prefixes.queried_tokens,
               "shared": engine.prefixes.shared_tokens, "preempted": engine.preemptions}
        metrics.PREFIX_CACHE_QUERIES.inc(now["queried"] - counted["queried"])
        metrics.PREFIX_CACHE_HITS.inc(now["shared"] - counted["shared"])
        metrics.NUM_PREEMPTIONS.inc(now["preempted"] - counted["preempted"])
        self._counted = now
        store = engine.store
        metrics.KV_BLOCKS.labels("used").set(store.held)
        metrics.KV_BLOCKS.labels("cached").set(store.cached)
        metrics.KV_BLOCKS.labels("free").set(store.available - store.cached)
        metrics.KV_CACHE_USAGE.set(store.usage)

    async def _gather(self) -> None:
        """Wait (at most max_wait_ms) until the last step's sessions are back in the queue."""
        if not self.settings.enabled or not self.settings.max_wait_ms:
            return
        deadline = time.perf_counter() + self.settings.max_wait_ms / 1000
        while self._queued_tokens() < self.settings.max_batch_tokens:
            waiting_for = self._expected - {id(i.sequence) for i in self.queue}
            remaining = deadline - time.perf_counter()
            if not waiting_for or remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _waits_for_prefix(self, item: _Item, batch: list[_Item]) -> bool:
        """Whether ``item`` is a new sequence that, one step later, could copy at least
        SHARED_PREFIX_WAIT more of its prompt from a new sequence of ``batch`` than a live
        sequence offers it now (sequences of its prefix scope only)."""
        context = item.sequence.committed
        if (item.sequence.cache.tokens or item.draft is None
                or item.sequence.prompt_logprobs.is_pending):  # it feeds its whole prompt
            return False
        scope = item.sequence.cache.scope  # only its scope's sequences may give it a prefix
        new = [i.sequence.committed for i in batch
               if not i.sequence.cache.tokens and i.sequence.cache.scope == scope]
        coming = min(longest_common(context, new), len(context) - 1)
        return coming >= self.engine.prefixes.held(context, scope) + SHARED_PREFIX_WAIT

    def _queued_tokens(self) -> int:
        return sum(i.tokens for i in self.queue)

    def _take(self) -> list[_Item]:
        """The next batch, in arrival order, within the token budget. A new sequence whose
        prompt begins like another new one's in the batch waits for the next step, where it
        copies that prefix instead of computing it again (``cascade.core.kv.prefix_cache``)."""
        batch: list[_Item] = []
        held: list[_Item] = []
        tokens = 0
        limit = self.settings.max_batch_tokens if self.settings.enabled else 0
        while self.queue:
            item = self.queue[0]
            if item.future.done():  # its caller went away: drop it unrun
                self.queue.popleft()
                metrics.VERIFIER_QUEUE_DEPTH.dec()
                continue
            if batch and (tokens + item.tokens > limit
                          or any(i.sequence is item.sequence for i in batch)):
                break
            item = self.queue.popleft()
            if self._waits_for_prefix(item, batch):
                held.append(item)
                continue
            batch.append(item)
            metrics.VERIFIER_QUEUE_DEPTH.dec()
            tokens += item.tokens
        self.queue.extendleft(reversed(held))
        return batch
