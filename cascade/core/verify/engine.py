"""The verification engine: one forward pass of the target verifies blocks from many sequences.

``VerifyEngine.step(items)`` takes ``(sequence, draft)`` pairs from any number of sessions,
ragged in cached length and in draft length, feeds them all in one packed pass
(``cascade.core.forward.packed``), then lets each ``SequenceVerifier`` apply its own acceptance policy
and limits to its rows. An item whose draft is ``None`` asks for the sequence's context features
instead (a feature drafter's first block). A bad item fails alone: its slot in the result holds
the exception (whatever it is: a bad draft, a grammar the row's tokens break, a sequence
closed meanwhile), the other rows are verified.

Memory: every sequence the engine admits holds a table of blocks of the engine's ``KVStore``,
grown as it grows (``cascade.core.verify.paged_cache``); admission counts the blocks it needs now, and
a sequence that does not fit raises ``KVBudgetExhausted``, which servers turn into
RESOURCE_EXHAUSTED. When a pass needs more blocks than are free, other sequences are preempted
(``paged_cache.make_room``). New sequences take the prefix a live or ended sequence of their
scope holds (``cascade.core.kv.prefix_cache``). ``engine_for(runner)`` is the engine the in-process
loop uses (default budget), so the exactness tests run the same code as the verifier pod.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from cascade.core.accept.batch_accept import accept_chains, guarded
from cascade.core.forward.invariant import KEY_BLOCK
from cascade.core.kv.kv_budget import default_budget
from cascade.core.kv.kv_store import BLOCK_SIZE, KVShape, KVStore, blocks_for
from cascade.core.verify.logprobs import leading_entries, score_ahead
from cascade.core.forward.packed import Feed, packed_forward
from cascade.core.forward.packed_backend import enable
from cascade.core.verify.paged_cache import KVBudgetExhausted, PagedCache, Preempted, make_room
from cascade.core.kv.prefix_cache import PrefixCache
from cascade.core.forward.row_rope import rope_switch
from cascade.core.model.runner import ForwardOutput, ModelRunner
from cascade.protocol.logprobs import TokenLogprobs


class Pass(NamedTuple):
    """One row of a step: make ``cache`` hold ``tokens`` and return outputs of its tail."""

    cache: PagedCache
    tokens: list[int]
    num_logits: int
    hidden_layers: tuple[int, ...] = ()
    num_hidden: int | None = None
    """Positions (from the end) whose hidden states are returned; None = num_logits, 0 = all
    positions fed."""
    parents: tuple[int, ...] | None = None
    """The last len(parents) tokens are a token tree's nodes (``cascade.core.trees``)."""
    num_leading: int = 0
    """Positions before the last ``num_logits`` whose entries are returned too, apart: a
    prompt's rows, scored for its log-probabilities (``ForwardOutput.leading``; at most
    ``logprobs.LEADING_CHUNK`` rows' logits are held at once)."""
    leading_top: int = 0
    """Alternatives per leading position (the prompt's top N)."""
    first_regime: int = 0
    """Positions (from 0) to feed alone first, in a row of their own, if the cache holds
    fewer: those of a rope's first regime (``VerifyEngine.rope_switch``), for a session
    resumed past it; 0: none."""


class VerifyEngine:
    """The target, its KV store, and the batched pass over many sequences."""

    def __init__(self, runner: ModelRunner, kv_tokens: int | None = None,
                 invariant: bool = True, share_prefixes: bool = True) -> None:
        self.runner = runner
        enable(runner.model)
        shape = KVShape.of(runner.model)
        capacity = kv_tokens or default_budget(shape, runner.max_length, runner.device)
        self.invariance = runner.probed_invariance() if invariant else None
        """The batch-invariant pass's rules (``cascade.core.forward.invariant``): a position's logits
        do not depend on what else is in the pass, so speculation never changes greedy output;
        None: the plain pass."""
        assert BLOCK_SIZE % KEY_BLOCK == 0
        self.store = KVStore(shape, capacity, runner.device, zero_values=invariant)
        leader = getattr(runner.model, "cascade_leader", None)  # a split target's rank 0
        self.store.mirror = leader.attach(self.store) if leader else None  # twins on its ranks
        self.rope_switch = rope_switch(runner.model)
        """Where the target's rotary frequencies change with the row's length (None: never)."""
        self.prefixes = PrefixCache(self.store, share_prefixes and self.rope_switch is None)
        """Live and ended sequences' prefixes, taken by new sequences that begin the same way
        (not where a position's keys depend on the length of the pass that fed it)."""
        self.lock = threading.Lock()
        """Held for a whole step: one model pass at a time."""
        self.preemptions = 0
        """Sequences preempted to make room, since the engine started."""
        self._admitted = 0

    @property
    def invariant(self) -> bool:
        return self.invariance is not None

    @property
    def invariance_verified(self) -> bool:
        return self.invariant and self.invariance.verified

    def admit(self, num_positions: int, scope: str = "", now: int | None = None
              ) -> PagedCache:
        """A cache for a sequence of at most ``num_positions`` positions whose first pass
        feeds ``now`` (default: all of them), or KVBudgetExhausted: when the store cannot
        hold ``num_positions`` even empty (``never_fits``), or when its free blocks, less
        those promised to admitted sequences not yet fed and one block of growth per live
        sequence, do not cover ``now``. It shares prefixes with caches of ``scope`` only
        (``cascade.core.kv.prefix_cache``)."""
        if blocks_for(num_positions) > self.store.num_blocks:
            raise KVBudgetExhausted(
                f"prompt plus max_new_tokens ({num_positions} positions) exceed the verifier's "
                f"whole KV budget ({self.store.capacity}); lower max_tokens", never_fits=True)
        need = blocks_for(num_positions if now is None else min(now, num_positions))
        promised = self.promised()
        if need + promised > self.store.available:
            raise KVBudgetExhausted(
                f"the verifier's KV budget cannot take {need * BLOCK_SIZE} more positions now "
                f"({self.store.reserved} of {self.store.capacity} held, "
                f"{promised * BLOCK_SIZE} promised to admitted sessions)")
        self._admitted += 1
        cache = PagedCache(self, scope, self._admitted, need)
        self.prefixes.add(cache)
        return cache

    def promised(self) -> int:
        """Blocks admitted sequences may still take without anyone being preempted: those of
        sequences not yet fed (or preempted), and one block of growth per live sequence."""
        live = self.prefixes.live()
        return sum(c.pending for c in live) + len(live)

    def step(self, items: list) -> list:
        """Verify ``(sequence, draft)`` pairs in one pass; see the module docstring."""
        results: list = [None] * len(items)
        passes, owners = [], []
        for i, (sequence, draft) in enumerate(items):
            try:
                planned = sequence.plan(draft)
                if planned is None:
                    results[i] = sequence.conclude(draft, None)
                else:
                    passes.append(planned)
                    owners.append(i)
            except Exception as exc:  # noqa: BLE001 - a bad row fails alone
                results[i] = exc
        if passes:
            kept = []
            for i, output in zip(owners, self.run_rows(passes)):
                if isinstance(output, Preempted):
                    results[i] = output
                else:
                    kept.append((i, output))
            if kept:
                self._conclude([items[i] for i, _ in kept], [o for _, o in kept],
                               [i for i, _ in kept], results)
        return results

    @staticmethod
    def _conclude(items: list, outputs: list[ForwardOutput], owners: list[int],
                  results: list) -> None:
        """Each row's acceptance (chains batched across sequences by rule, trees one by
        one), then its commit; a row that raises fails alone."""
        rows = {j: guarded(items[j][0].acceptance_row, items[j][1], outputs[j])
                for j, (_, draft) in enumerate(items)
                if draft is not None and draft.parents is None}
        decided = accept_chains(rows)
        for j, ((sequence, draft), output) in enumerate(zip(items, outputs)):
            if draft is not None and draft.parents is not None:
                decided[j] = guarded(sequence.accept_tree, draft, output)
            result = decided.get(j)
            results[owners[j]] = (result if isinstance(result, Exception)
                                  else guarded(sequence.conclude, draft, output, result))

    def run(self, passes: list[Pass]) -> list[ForwardOutput]:
        """``run_rows``, raising when a row's sequence was preempted."""
        outputs = self.run_rows(passes)
        for output in outputs:
            if isinstance(output, Preempted):
                raise output
        return outputs

    def run_rows(self, passes: list[Pass]) -> list[ForwardOutput | Preempted]:
        """One packed forward pass over every row (new rows first take the prefix a live or
        ended sequence holds: ``cascade.core.kv.prefix_cache``; sequences are preempted when
        the store lacks blocks: ``paged_cache.make_room``). A row whose own sequence was
        preempted gets ``Preempted`` instead of outputs."""
        with self.lock:
            self.prefixes.fill(passes)
            dropped = make_room(self, passes)
            kept = [p for i, p in enumerate(passes) if i not in dropped]
            outputs = iter(self._forward(kept) if kept else [])
        return [Preempted("this sequence's KV blocks were taken for others; it runs again "
                          "once blocks free") if i in dropped else next(outputs)
                for i in range(len(passes))]

    def _forward(self, passes: list[Pass]) -> list[ForwardOutput]:
        for p in passes:
            self._feed_first_regime(p)
        ahead = [self._score_ahead(p) for p in passes]
        passes = [p for p, _ in ahead]
        feeds: list[Feed] = []
        try:
            for p in passes:
                feeds.append(p.cache.feed(p.tokens, p.num_leading + p.num_logits, p.parents))
            keep, ends, end = [], [], 0
            for p, f in zip(passes, feeds):
                end += len(f.tokens)
                keep.append(torch.arange(end - p.num_leading - p.num_logits, end))
                ends.append(end)
            vocab_map = self.runner.vocab_map
            logits, states = packed_forward(self.runner.model, self.store, feeds,
                                            torch.cat(keep),
                                            any(p.hidden_layers for p in passes),
                                            None if vocab_map is None else vocab_map.to_local,
                                            self.invariance)
        except BaseException:  # nothing was cached: the tables hold only what they held
            for p, f in zip(passes, feeds):
                p.cache.tokens = p.cache.tokens[: f.start]
            raise
        for p in passes:  # committed positions are final: the prefix cache may keep them
            self.prefixes.register(p.cache, len(p.tokens) - p.num_logits)
        return self._outputs(passes, feeds, ends, logits.cpu(), states,
                             [scored for _, scored in ahead])

    def _feed_first_regime(self, p: Pass) -> None:
        """A row's first ``first_regime`` positions, fed alone first where its cache does not
        hold them and it needs no logits of them: in a row of that length they get the first
        regime's frequencies, as one-token decoding gave them; the row then feeds the rest."""
        end = p.first_regime
        if (end and len(p.cache.tokens) < end
                and end <= len(p.tokens) - p.num_leading - p.num_logits):
            self._forward_alone(p, end, 1)

    def _score_ahead(self, p: Pass) -> tuple[Pass, list[TokenLogprobs]]:
        """``logprobs.score_ahead``; not where a rope's frequencies depend on the row's length
        (a part is a shorter row)."""
        if self.rope_switch is not None:
            return p, []
        return score_ahead(p, self._forward_alone)

    def _forward_alone(self, p: Pass, end: int, num_logits: int) -> torch.Tensor:
        """Feed ``p``'s tokens up to ``end`` (after those its cache holds) in a pass of their
        own; the logits of the last ``num_logits`` of them, [num_logits, vocab] float32 in the
        full vocabulary."""
        feed, vocab_map = p.cache.feed(p.tokens[:end], num_logits), self.runner.vocab_map
        try:
            logits, _ = packed_forward(
                self.runner.model, self.store, [feed],
                torch.arange(len(feed.tokens) - num_logits, len(feed.tokens)),
                to_local=None if vocab_map is None else vocab_map.to_local,
                invariance=self.invariance)
        except BaseException:  # nothing was cached
            p.cache.tokens = p.cache.tokens[: feed.start]
            raise
        logits = logits.cpu()
        return logits if vocab_map is None else vocab_map.expand(logits)

    def _outputs(self, passes: list[Pass], feeds: list[Feed], ends: list[int],
                 logits: torch.Tensor, states, scored: list[list[TokenLogprobs]]
                 ) -> list[ForwardOutput]:
        """Each row's logits (in the full vocabulary), hidden states and leading rows' entries
        (``scored``: each row's entries scored ahead, ``_score_ahead``)."""
        outputs, first_logit, vocab_map = [], 0, self.runner.vocab_map
        for p, f, stop, ahead in zip(passes, feeds, ends, scored):
            rows = logits[first_logit : first_logit + p.num_leading + p.num_logits]
            first_logit += p.num_leading + p.num_logits
            if vocab_map is not None:
                rows = vocab_map.expand(rows)
            num_hidden = p.num_logits if p.num_hidden is None else p.num_hidden
            first = stop - (num_hidden or len(f.tokens))
            hidden = tuple(states[layer][first:stop].cpu() for layer in p.hidden_layers)
            outputs.append(ForwardOutput(rows[p.num_leading :], hidden,
                                         leading_entries(p, rows, ahead)))
        return outputs


_ENGINES_LOCK = threading.Lock()


def engine_for(runner: ModelRunner) -> VerifyEngine:
    """The runner's engine (created with the default budget on first use)."""
    with _ENGINES_LOCK:
        engine = getattr(runner, "verify_engine", None)
        if engine is None:
            engine = runner.verify_engine = VerifyEngine(runner)
        return engine
