"""Verification: the target model scores a draft in one pass and keeps what the policy allows.

A ``SequenceVerifier`` owns the committed tokens of one generation (prompt included) and its
blocks of the engine's KV store (``cascade.core.verify.engine``). A round feeds the last
committed token plus the k drafted tokens, gets the k+1 target distributions, applies the
session's acceptance policy with its per-position random numbers, and commits the accepted
tokens plus one recovered or bonus token. A draft with no tokens is plain target decoding (k = 0).

The forward pass is the engine's, shared with other sequences: ``plan`` says what this sequence
feeds, ``conclude`` applies the policy and limits to its rows. ``verify`` is a step of one item.
"""

from __future__ import annotations

import weakref

import torch

from cascade.core.accept.batch_accept import AcceptRow, RowResult
from cascade.core.blocks import (Draft, RoundOutcome, TargetFeatures, TokenLogprobs,
                                 cut_at_limits)
from cascade.core.accept.draft_checks import InvalidDraft, check_draft
from cascade.core.verify.engine import Pass, VerifyEngine, engine_for
from cascade.core.sample.grammar import matcher_for
from cascade.core.verify.logprobs import PromptLogprobs, emitted_logprobs
from cascade.core.sample.processors import fill, processed
from cascade.core.model.runner import ForwardOutput, ModelRunner
from cascade.core.sample.sampling import (STREAM_ACCEPT, STREAM_SAMPLE, KeyedNoise,
                                          position_uniforms, process_logits, sparse_to_dense)
from cascade.core.accept.tree_accept import row_depths, target_choices, walk, walk_recursive
from cascade.protocol.settings import FinishReason, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from cascade.protocol.stats import SpecStats


class SequenceVerifier:
    """The target side of one generation."""

    def __init__(self, runner: ModelRunner, context: list[int], params: SamplingParams,
                 prompt_len: int | None = None, policy: AcceptancePolicy | None = None,
                 engine: VerifyEngine | None = None, tree_room: int = 0,
                 prefix_scope: str = "") -> None:
        """``context`` is the prompt followed by any tokens already committed (a moved session
        resumes this way); ``prompt_len`` says where the prompt ends (default: all of it);
        ``policy`` defaults to the one for the temperature; ``engine`` to the runner's own.
        Admitted for the KV blocks its context and one tree of ``tree_room`` nodes need now
        (``KVBudgetExhausted`` when they are not free, or when prompt plus max_new_tokens plus
        the tree could never fit); its blocks grow as it does; ``close`` gives them back (so
        does garbage collection). ``prefix_scope``: whose
        sequences it may copy prompt prefixes from (``cascade.core.kv.prefix_cache``)."""
        prompt_len = len(context) if prompt_len is None else prompt_len
        if not 0 < prompt_len <= len(context):
            raise ValueError(f"prompt_len must be in [1, {len(context)}], got {prompt_len}")
        if any(not 0 <= t < runner.vocab_size for t in context):
            raise ValueError(f"context token ids must be in [0, {runner.vocab_size})")
        if len(context) >= runner.max_length:
            raise ValueError(f"context has {len(context)} tokens; the model's context is "
                             f"{runner.max_length}")
        if prompt_len + params.max_new_tokens > runner.max_length:
            raise ValueError(f"prompt ({prompt_len} tokens) plus max_new_tokens "
                             f"({params.max_new_tokens}) exceed the model's context "
                             f"({runner.max_length} tokens)")
        self.policy = policy or AcceptancePolicy.default_for(params)
        self.policy.check(params)
        self.runner = runner
        self.params = params
        self.prompt_len = prompt_len
        self.committed: list[int] = list(context)
        self.engine = engine or engine_for(runner)
        self.positions = prompt_len + params.max_new_tokens + tree_room
        """Most positions this generation can hold."""
        self.cache = self.engine.admit(self.positions, prefix_scope,
                                       now=len(context) + tree_room + 1)
        self._release = weakref.finalize(self, self.cache.release)
        self.finish_reason: FinishReason | None = None
        self.stats = SpecStats()
        self.last_forward: ForwardOutput | None = None
        self.noise = KeyedNoise(params.seed, runner.vocab_size)
        """The keyed rule's noise rows by position, from the committed length on."""
        self.feature_layers: tuple[int, ...] = ()
        """The target layers whose hidden states the drafter asked for (none by default)."""
        self.last_features: TargetFeatures | None = None
        """The features of the positions the last round committed and fed (when asked)."""
        self.grammar = matcher_for(runner, params.grammar, self.generated)
        """The structured output's state after the generated tokens (None: free text)."""
        self.prompt_logprobs = PromptLogprobs(params.prompt_logprobs, context[:prompt_len],
                                              is_fresh=len(context) == prompt_len)
        self._forced_rows: list[bool] = []
        """Per row of the block being judged: whether the processed p is a point mass."""

    @property
    def generated(self) -> list[int]:
        return self.committed[self.prompt_len :]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def max_draft_len(self) -> int:
        """Most drafted tokens worth verifying now (the prompt plus max_new_tokens fit in the
        context, so every such position does too)."""
        return self.params.max_drafts_after(len(self.generated))

    def close(self) -> None:
        """Give the KV blocks back (idempotent). Call it where the engine's steps run (the
        model thread): blocks released under a running step would fail the whole step."""
        self._release()

    @property
    def is_closed(self) -> bool:
        return not self._release.alive

    def verify(self, draft: Draft) -> RoundOutcome:
        """Score ``draft`` after the committed tokens and commit what the policy keeps."""
        return _unwrap(self.engine.step([(self, draft)])[0])

    def prefill_features(self) -> TargetFeatures | None:
        """Feed the context but its last token and return their features (positions 0 ..
        len - 2): a feature drafter drafts its first block from them."""
        return _unwrap(self.engine.step([(self, None)])[0])

    def pending_tokens(self, draft: Draft | None) -> int:
        """About how many tokens this sequence's next row feeds (for batch budgets)."""
        if draft is None:
            return max(len(self.committed) - 1, 1)
        cached = len(self.cache.tokens)
        return max(len(self.committed) - cached, 1) + draft.num_tokens

    def plan(self, draft: Draft | None) -> Pass | None:
        """This sequence's row of an engine step (None: nothing to feed). Raises InvalidDraft."""
        if self.is_closed:
            raise InvalidDraft("block: the session was closed")
        if draft is None:
            if not self.feature_layers or len(self.committed) < 2:
                return None
            return Pass(self.cache, self.committed[:-1], 1, self.feature_layers, num_hidden=0,
                        num_leading=self.prompt_logprobs.num_leading(len(self.committed) - 2),
                        leading_top=self.prompt_logprobs.top or 0)
        if self.is_finished:
            raise InvalidDraft(f"block: the generation already finished "
                               f"({self.finish_reason.value})")
        self._check(draft)
        parents = None if draft.parents is None else tuple(draft.parents)
        return Pass(self.cache, self.committed + draft.tokens, draft.num_tokens + 1,
                    self.feature_layers, parents=parents,
                    num_leading=self.prompt_logprobs.num_leading(len(self.committed) - 1),
                    leading_top=self.prompt_logprobs.top or 0,
                    first_regime=self._first_regime())

    def _first_regime(self) -> int:
        """Where a resumed session's context crosses the target rope's switch from a prompt
        that did not (``VerifyEngine.rope_switch``): the positions before it are fed in the
        first regime, as one-token decoding fed them (0: nothing to split)."""
        switch = self.engine.rope_switch
        if switch is None or not self.prompt_len <= switch < len(self.committed):
            return 0
        return switch

    def conclude(self, draft: Draft | None, output: ForwardOutput | None,
                 result: RowResult | None = None):
        """Commit this sequence's part of a step: ``output`` is its rows of the pass, ``result``
        what its acceptance policy decided on them (``acceptance_row``)."""
        self.last_forward = output
        if output is not None:  # the pass that first fed the prompt scores it, when asked
            self.prompt_logprobs.take(output, len(self.committed) - (1 if draft else 2))
        if draft is None:
            return None if output is None else self._features(0, len(self.committed) - 1)
        num_accepted, next_token, deferred, path = result
        path = list(range(num_accepted)) if path is None else list(path)
        accepted = [draft.tokens[node] for node in path]
        if draft.parents is not None:
            self.cache.compact(len(self.committed), path, accepted)
        self.last_features = self._features(len(self.committed) - 1, [0] + [n + 1 for n in path])
        emitted = self._apply_limits(accepted + [next_token])
        # A stop token or the length limit inside the accepted drafts ends the round there:
        # the drafts after it were accepted but not committed, so they count for nothing.
        num_accepted = min(num_accepted, len(emitted))
        forced = sum(self._forced_rows[r] for r in ([0] + [n + 1 for n in path])[:len(emitted)])
        logprobs = self._logprobs(output, path, emitted)
        self._commit(emitted)
        filled = self._fill()
        self.stats.observe(draft.num_tokens, num_accepted, len(emitted) + len(filled), deferred,
                           forced + len(filled), len(filled))
        return RoundOutcome(num_accepted, emitted + filled, len(self.committed),
                            self.finish_reason, deferred,
                            tuple(path[:num_accepted]) if draft.parents is not None else None,
                            logprobs,
                            self.prompt_logprobs.hand_out(), forced + len(filled), len(filled))

    def _commit(self, tokens: list[int]) -> None:
        self.committed += tokens
        if self.grammar is not None:
            self.grammar.commit(tokens)

    def _fill(self) -> list[int]:
        """Jump-forward after the round's own token: the tokens the grammar forces next
        (``cascade.core.sample.processors.fill``), committed without a pass and fed in the next one.
        Exact: the target under the same mask emits each of them whatever its logits. Not when
        the emitted tokens need rows of this pass (logprobs, a feature drafter's features)."""
        if (self.grammar is None or self.is_finished or self.params.logprobs is not None
                or self.feature_layers):
            return []
        room = self.params.max_new_tokens - len(self.generated)
        filled = self._apply_limits(fill(self.grammar, self.params, self.generated, room))
        self._commit(filled)
        return filled

    def _logprobs(self, output: ForwardOutput, path: list[int], emitted: list[int]
                  ) -> tuple[TokenLogprobs, ...] | None:
        """The emitted tokens' log-probabilities, when asked (``cascade.core.verify.logprobs``)."""
        if self.params.logprobs is None:
            return None
        return emitted_logprobs(output.logits, path, emitted, self.params.logprobs)

    def accept_tree(self, draft: Draft, output: ForwardOutput) -> RowResult:
        """The walk down a tree (``cascade.core.accept.tree_accept``) over its n+1 logits rows."""
        if self.policy.rule is AcceptanceRule.RECURSIVE:
            logits = self._processed(output.logits, draft)
            p = process_logits(logits, self.params)  # [n+1, vocab]
            q = sparse_to_dense(draft.q_ids, draft.q_probs, output.logits.shape[-1])  # [n, vocab]
            verdict = walk_recursive(draft.parents, draft.tokens, p, q, self.params.seed,
                                     len(self.committed))
            return RowResult(len(verdict.path), verdict.next_token, 0, tuple(verdict.path))
        rows = row_depths(draft.parents)
        noise = None
        if self.policy.rule is AcceptanceRule.KEYED:
            base = len(self.committed)
            noise = self._noise(base, max(rows) + 1)[torch.tensor(rows)]
        logits = self._processed(output.logits, draft)
        choices = target_choices(logits, self.params, noise).tolist()
        verdict = walk(draft.parents, draft.tokens, choices)
        return RowResult(len(verdict.path), verdict.next_token, 0, tuple(verdict.path))

    def acceptance_row(self, draft: Draft, output: ForwardOutput) -> AcceptRow:
        """What this sequence's policy needs to judge ``draft`` (its k+1 logits rows, its q,
        the random numbers of its positions)."""
        k, base, seed = draft.num_tokens, len(self.committed), self.params.seed
        vocab = output.logits.shape[-1]
        noise = self._noise(base, k + 1) if self.policy.rule is AcceptanceRule.KEYED else None
        logits = self._processed(output.logits, draft)
        return AcceptRow(self.policy, self.params, list(draft.tokens), logits,
                         self._dense_proposal(draft, vocab),
                         position_uniforms(seed, base, k, STREAM_ACCEPT),
                         position_uniforms(seed, base, k + 1, STREAM_SAMPLE),
                         self._dense_decision(draft, vocab), noise)

    def _processed(self, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
        """The target's logits ([rows, vocab], one row per position of ``draft``'s block, the
        root's first) as the request's processors shape them (``cascade.core.sample.processors``).
        Notes which rows they leave one token (``_forced_rows``: forced positions)."""
        shaped = processed(logits, draft, self.params, self.committed, self.prompt_len,
                           self.grammar)
        self._forced_rows = ([False] * len(logits) if self.grammar is None
                             else (torch.isfinite(shaped).sum(-1) == 1).tolist())
        return shaped

    def _noise(self, base: int, count: int) -> torch.Tensor:
        """[count, vocab] the keyed rule's noise for positions base .. base + count - 1 (rows
        of positions a rejection left unused are kept for the next round)."""
        self.noise.forget_before(base)
        return self.noise.rows(range(base, base + count))

    def _features(self, start: int, rows: list[int] | int) -> TargetFeatures | None:
        """Rows ``rows`` of the last pass's features (a count: the first ones), for the
        positions from ``start`` on."""
        if not self.feature_layers:
            return None
        stacked = torch.cat(self.last_forward.hidden_states, dim=-1)  # [rows, layers * d]
        picked = stacked[:rows] if isinstance(rows, int) else stacked[torch.tensor(rows)]
        return TargetFeatures(start, picked)

    def _dense_proposal(self, draft: Draft, vocab: int) -> torch.Tensor | None:
        if not draft.has_proposal or self.policy.rule in (AcceptanceRule.GREEDY,
                                                          AcceptanceRule.KEYED):
            return None
        return sparse_to_dense(draft.q_ids, draft.q_probs, vocab)  # [k, vocab]

    def _dense_decision(self, draft: Draft, vocab: int) -> torch.Tensor | None:
        """The temperature-1 q a cascade rule decides on, when the block carries one apart
        from q (sampling); None: the rule decides on q."""
        if draft.decision_ids is None or self.policy.rule.is_lossless or not draft.has_proposal:
            return None
        return sparse_to_dense(draft.decision_ids, draft.decision_probs, vocab)  # [k, vocab]

    def _check(self, draft: Draft) -> None:
        check_draft(draft, self.policy.rule, self.runner.vocab_size, self.max_draft_len(),
                    self.positions - len(self.committed))

    def _apply_limits(self, emitted: list[int]) -> list[int]:
        """Cut the round's tokens at the first stop token or at max_new_tokens."""
        emitted, finish = cut_at_limits(emitted, self.params, len(self.generated))
        self.finish_reason = self.finish_reason or finish
        return emitted


def _unwrap(result):
    if isinstance(result, Exception):
        raise result
    return result
