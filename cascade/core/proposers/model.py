"""The drafter model proposes k tokens (and, for sampling, the sparse q each was sampled from).

The drafter model is either a small causal LM (``ModelRunner``) or a feature drafter
(``FeatureRunner``): both hand out caches that answer ``forward_to`` and ``extend`` with logits,
and a feature drafter's cache also takes the target's features (``observe``).

Its cache follows the committed tokens by position (``SequenceCache.forward_to``): after a
verdict, the rejected tail is dropped and the next round starts from the committed sequence, so
the proposer needs no notion of what the verifier accepted beyond the tokens themselves.
"""

from __future__ import annotations

import torch

from cascade.core.blocks import Draft, TargetFeatures
from cascade.core.model.branches import Branches
from cascade.core.sample.grammar import GrammarCursor
from cascade.core.sample.processors import is_shaping
from cascade.core.proposers.base import DraftStopped, Guesses, Proposer, ProposerContext
from cascade.core.proposers.choice import TokenChoice
from cascade.core.proposers.schedule import AdaptiveSchedule
from cascade.core.proposers.shaping import DraftShaper, point_mass
from cascade.core.proposers.tree import (
    TreeShape,
    draft_confident_tree,
    draft_sampled_tree,
    draft_tree,
    log_softmax_rank,
)
from cascade.core.proposers.tree_speculation import stoppable, tree_logits
from cascade.core.model.runner import common_prefix_len
from cascade.core.sample.sampling import (
    STREAM_CHILD_DRAFT,
    KeyedNoise,
    position_uniform,
    process_logits,
    sample_from,
    sparsify,
)
from cascade.protocol.limits import MAX_DRAFT_TOKENS
from cascade.protocol.acceptance import AcceptanceRule


def _grammar_cursor(context: ProposerContext) -> GrammarCursor | None:
    """The request's grammar for a model with the target's tokenizer (None: free text, or a
    drafter that cannot match it)."""
    tokenizer = getattr(context.runner, "tokenizer", None)
    if context.sampling.grammar is None or tokenizer is None:
        return None
    return GrammarCursor(context.sampling.grammar, tokenizer, context.runner.vocab_size)


def _shaper(context: ProposerContext) -> DraftShaper | None:
    """Chains and batched pre-drafts shape q with the request's processors and grammar, as the
    verifier shapes p (trees draft unshaped: still exact, less often accepted); None when the
    request has nothing to shape with."""
    cursor = _grammar_cursor(context)
    if cursor is None and not is_shaping(context.sampling, 0):
        return None
    return DraftShaper(context.sampling, context.prompt_len, cursor)


def _has_choice(shaped: torch.Tensor, raw: torch.Tensor) -> bool:
    """Whether the shaped row leaves the drafter any token (a restricted vocabulary may hold
    none of those the processors allow: the block ends there)."""
    return shaped is raw or bool(torch.isfinite(shaped).any())


CATCH_UP_CHUNK = 256
"""Positions fed per forward pass when the adaptive schedule catches up on a long context."""


class ModelProposer(Proposer, Guesses):
    """Drafts with the drafter model's own KV cache."""

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.cache = context.runner.new_cache(context.prefix_scope)
        self.wants_target_features = getattr(self.cache, "wants_target_features", False)
        self.feature_layers = getattr(context.runner, "feature_layers", ())
        self.first_generated = max(context.prompt_len, 1)
        self.greedy_choices: list[int] = []
        """The drafter's argmax at each generated position given the committed tokens before
        it (adaptive schedule only), from ``first_generated`` on."""
        self.schedule = None
        rule = context.policy.rule if context.policy is not None else None
        self.keyed = rule is AcceptanceRule.KEYED
        """Position-keyed sampling: draft the keyed choice under the drafter's own q (the
        target's choice whenever the two agree), send no q."""
        self.vocab_size = context.runner.vocab_size
        self.noise = (KeyedNoise(self.sampling.seed, self.vocab_size) if self.keyed
                      else None)
        self.choice = TokenChoice(self.sampling, self.config, self.noise, self.needs_greedy_q)
        self.recursive = rule is AcceptanceRule.RECURSIVE and bool(self.config.tree_nodes)
        """Recursive rule with trees: draw each node's children from q (``_sample_children``)."""
        if self.config.adaptive and self.wants_target_features:
            raise ValueError("adaptive draft length needs a model drafter; a feature drafter "
                             "predicts one position at a time")
        self.shaper = _shaper(context)
        """The request's processors and grammar on q (None: nothing shapes it)."""
        if self.config.adaptive:
            self.schedule = AdaptiveSchedule(self.config.num_draft_tokens,
                                             *self.config.adaptive_bounds)

    @property
    def can_guess(self) -> bool:
        """The adaptive schedule learns from every context it drafts after, so it may only see
        committed ones: no pre-drafting for guesses with it. Nor with the recursive rule's
        sampled trees: there the round's last token is drawn from a residual of the target's p
        after the rejected children, which the drafter's q does not rank, so its guesses would
        rarely hit while each costs a tree."""
        return self.schedule is None and not self.recursive

    def filled_after(self, context: list[int]) -> list[int]:
        """What the verifier fills in after ``context`` (it does not when the round's tokens
        need rows of its pass: logprobs, features)."""
        if self.shaper is None or self.sampling.logprobs is not None or self.wants_target_features:
            return []
        room = self.sampling.max_new_tokens - (len(context) - self.prompt_len)
        return self.shaper.fill_after(context, room)

    def observe(self, features: TargetFeatures) -> None:
        if self.wants_target_features:
            self.cache.observe(features.start, features.hidden_states)

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        if num_tokens <= 0 or (self.wants_target_features and len(committed) < 2):
            return Draft(tokens=[])  # a feature drafter's first entry needs two tokens
        if self.noise is not None:
            self.noise.forget_before(len(committed))
        if self.config.tree_nodes:
            return self._propose_tree(committed, num_tokens, stop)
        logits = None
        if self.schedule is not None:
            logits = self._catch_up(committed)
            num_tokens = min(num_tokens, self._scheduled_length(committed))
        return self._chain(committed, num_tokens, logits, stop)

    def _chain(self, committed: list[int], num_tokens: int, logits: torch.Tensor | None,
               stop=None) -> Draft:
        """Up to ``num_tokens`` tokens of the model after ``committed`` (``logits``: its row
        there, when already computed), each from its shaped row, and every position the grammar
        forces on the way (jump-forward: filled without the model and not counted against
        ``num_tokens``), within the longest block the verifier takes."""
        tokens, rows, unfed = [], [], []  # unfed: drafted tokens the model has not seen yet
        num_model = 0
        while len(tokens) < self._room(committed):
            position = self.shaper.at(committed, tokens) if self.shaper is not None else None
            forced = position.forced if position is not None else None
            if forced is not None:
                row = point_mass(forced, self.vocab_size)
            else:
                if num_model == num_tokens:
                    break
                if num_model and stop is not None and stop():
                    raise DraftStopped()
                logits = self._logits_after(committed, tokens, unfed, logits)
                unfed = []
                row = logits if position is None else position.shape(logits)
                if (num_model and self.choice.is_unsure(row)) or not _has_choice(row, logits):
                    break
                num_model += 1
            token, *q = self.choice.choose(row, len(committed) + len(tokens))
            tokens.append(token)
            rows.append(q)
            unfed.append(token)
            if token in self.sampling.stop_token_ids:
                break
        return self.choice.draft(tokens, rows)

    def _logits_after(self, committed: list[int], tokens: list[int], unfed: list[int],
                      logits: torch.Tensor | None) -> torch.Tensor:
        """The model's row after ``committed`` + ``tokens`` ([vocab]): ``logits`` when it is
        that row already, else one pass over what the cache lacks (forced tokens included)."""
        if logits is None:
            return self.cache.forward_to(committed + tokens).logits[-1]
        if self.wants_target_features:  # a feature drafter's cache takes one token a step
            for token in unfed:
                logits = self.cache.extend([token]).logits[-1]
            return logits
        return self.cache.extend(unfed).logits[-1] if unfed else logits

    def _room(self, committed: list[int]) -> int:
        """The longest block the verifier takes after ``committed``."""
        return min(MAX_DRAFT_TOKENS, self.depth_left(committed))

    def propose_many(self, contexts: list[list[int]], budgets: list[int], stop=None
                     ) -> list[Draft]:
        """Drafts after contexts that share a prefix, as rows of one batch per step (a feature
        drafter, and trees, draft them one by one); stopped, each row keeps what it has
        drafted."""
        if self.wants_target_features or self.config.tree_nodes or len(contexts) < 2:
            return super().propose_many(contexts, budgets, stop)
        shared = min(min(common_prefix_len(contexts[0], c) for c in contexts),
                     min(len(c) for c in contexts) - 1)
        branches = Branches(self.cache, contexts[0][:shared], len(contexts))
        logits = branches.feed([c[shared:] for c in contexts])  # [B, vocab]
        tokens, rows = [[] for _ in contexts], [[] for _ in contexts]
        for i in range(max(budgets)):
            for b, context in enumerate(contexts):
                if len(tokens[b]) != i or i >= budgets[b]:
                    continue
                shaped = (logits[b] if self.shaper is None
                          else self.shaper.at(context, tokens[b]).shape(logits[b]))
                if not (i and self.choice.is_unsure(shaped)) and _has_choice(shaped, logits[b]):
                    token, *q = self.choice.choose(shaped, len(context) + i)
                    tokens[b].append(token)
                    rows[b].append(q)
            if i + 1 == max(budgets) or (stop is not None and stop()):
                break  # stopped: every row keeps the tokens drafted so far
            logits = branches.feed([t[i:] if len(t) == i + 1 else [] for t in tokens])
        return [self.choice.draft(t, r) for t, r in zip(tokens, rows)]

    @torch.inference_mode()
    def block_distributions(self, committed: list[int], drafted: list[int],
                            parents: list[int] | None = None) -> torch.Tensor:
        """Temperature-1 probabilities [len(drafted) + 1, vocab]: one pass over the block for a
        model drafter (a tree's nodes each see their ancestors: ``tree_logits``), a step per
        token for a feature drafter (it predicts one at a time)."""
        if parents is not None:
            logits = tree_logits(self.cache, committed, drafted, parents)
        elif self.wants_target_features:
            rows = [self.cache.forward_to(committed).logits[-1]]
            rows += [self.cache.extend([token]).logits[-1] for token in drafted]
            logits = torch.stack(rows)
        else:
            logits = self.cache.forward_to(committed + drafted,
                                          num_logits=len(drafted) + 1).logits
        return torch.softmax(logits.float(), dim=-1)

    def _propose_tree(self, committed: list[int], budget: int, stop=None) -> Draft:
        """A tree of at most ``budget`` nodes (``DraftConfig.tree_shape``; the verifier keeps
        room for ``tree_nodes``, from SessionOpen.tree_nodes); ``stop`` is checked before each
        depth (a pre-draft the verdict stopped raises ``DraftStopped``)."""
        shape = TreeShape(*self.config.tree_shape(budget, self.depth_left(committed)),
                          self.config.tree_branching)
        if self.recursive:
            tokens, parents, q_ids, q_probs = draft_sampled_tree(self.cache, committed, shape,
                                                                 self._sample_children)
            return Draft(tokens, q_ids, q_probs, parents=parents)
        rank = stoppable(self._keyed_rank if self.keyed else log_softmax_rank, stop)
        grow = draft_confident_tree if self.config.tree_expansion == "confidence" else draft_tree
        tokens, parents = grow(self.cache, committed, shape, rank)
        return Draft(tokens, parents=parents)

    def _sample_children(self, logits: torch.Tensor, position: int, count: int):
        """Up to ``count`` distinct children per row, drawn without replacement from the row's
        sparse q: child j from q with children 0 .. j-1 removed and renormalised, which is the
        q it carries (-1: the support ran out)."""
        ids, values = sparsify(process_logits(logits, self.sampling),
                               self.config.max_proposal_tokens)  # [F, K] each
        left = values.double()
        children, proposals = [], []
        for j in range(count):
            mass = left.sum(-1, keepdim=True)  # [F, 1]
            alive = mass[:, 0] > 1e-12
            q = torch.where(alive[:, None], left / mass.clamp_min(1e-300),
                            values.double()).float()  # [F, K]: as sent, and sampled as sent
            u = position_uniform(self.sampling.seed, position, STREAM_CHILD_DRAFT + j)
            column = sample_from(q, torch.full((len(q),), u, dtype=torch.float64))  # [F]
            children.append(torch.where(alive, ids.gather(1, column[:, None])[:, 0], -1))
            proposals.append(q)
            left = left.scatter(1, column[:, None], 0.0)
        return torch.stack(children, 1), ids, torch.stack(proposals, 1)

    def _keyed_rank(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """Children ranked by log q + the position's noise: the first is the keyed choice."""
        noise = self.noise.rows([position])  # [1, vocab]
        return torch.log_softmax(process_logits(logits, self.sampling).double().log() + noise,
                                 dim=-1)

    def _catch_up(self, committed: list[int]) -> torch.Tensor:
        """The last position's logits, after noting the drafter's greedy choice at every
        generated position that has none yet (a few per round; the whole generation, in chunks,
        when a moved session arrives)."""
        start = self.first_generated + len(self.greedy_choices) - 1
        logits = None
        while logits is None or start < len(committed):
            end = min(start + CATCH_UP_CHUNK, len(committed))
            rows = self.cache.forward_to(committed[:end], num_logits=end - start).logits
            # row i holds the logits after committed[start + i]: the choice for start + i + 1
            self.greedy_choices.extend(rows[:len(committed) - start - 1].argmax(-1).tolist())
            logits, start = rows[-1], end
        return logits

    def _scheduled_length(self, committed: list[int]) -> int:
        generated = committed[self.first_generated:]
        matches = [c == g for c, g in zip(self.greedy_choices, generated, strict=True)]
        return self.schedule.advance(matches)
