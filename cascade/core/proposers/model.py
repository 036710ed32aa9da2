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
from cascade.core.branches import Branches
from cascade.core.grammar import GrammarCursor
from cascade.core.proposers.base import DraftStopped, Proposer, ProposerContext
from cascade.core.proposers.schedule import AdaptiveSchedule
from cascade.core.proposers.tree import (
    TreeShape,
    draft_confident_tree,
    draft_sampled_tree,
    draft_tree,
    log_softmax_rank,
)
from cascade.core.runner import common_prefix_len
from cascade.core.sampling import (
    STREAM_CHILD_DRAFT,
    STREAM_DRAFT,
    KeyedNoise,
    keyed_choice,
    position_uniform,
    process_logits,
    sample_from,
    sparsify,
)
from cascade.protocol.settings import AcceptanceRule


def _grammar_cursor(context: ProposerContext) -> GrammarCursor | None:
    """Chains drafted by a model with the target's tokenizer mask q with the request's grammar
    (trees and batched pre-drafts draft unmasked: still exact, less often accepted)."""
    tokenizer = getattr(context.runner, "tokenizer", None)
    if context.sampling.grammar is None or tokenizer is None:
        return None
    return GrammarCursor(context.sampling.grammar, tokenizer, context.runner.vocab_size)


CATCH_UP_CHUNK = 256
"""Positions fed per forward pass when the adaptive schedule catches up on a long context."""


class ModelProposer(Proposer):
    """Drafts with the drafter model's own KV cache."""

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.cache = context.runner.new_cache()
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
        self.noise = (KeyedNoise(self.sampling.seed, context.runner.vocab_size) if self.keyed
                      else None)
        self.recursive = rule is AcceptanceRule.RECURSIVE and bool(self.config.tree_nodes)
        """Recursive rule with trees: draw each node's children from q (``_sample_children``)."""
        if self.config.tree_nodes and self.wants_target_features:
            raise ValueError("tree_nodes: token trees need a model drafter; a feature drafter "
                             "predicts one position at a time")
        if self.config.adaptive and self.wants_target_features:
            raise ValueError("adaptive draft length needs a model drafter; a feature drafter "
                             "predicts one position at a time")
        self.prompt_len = context.prompt_len
        self.grammar = _grammar_cursor(context)
        """The structured output's state for masking q (None: free text, or no tokenizer)."""
        if self.config.adaptive:
            self.schedule = AdaptiveSchedule(self.config.num_draft_tokens,
                                             *self.config.adaptive_bounds)

    @property
    def can_speculate(self) -> bool:
        """The adaptive schedule learns from every context it drafts after, so it may only see
        committed ones: no pre-drafting for guesses with it (nor, for now, with trees)."""
        return self.schedule is None and not self.config.tree_nodes

    def observe(self, features: TargetFeatures) -> None:
        if self.wants_target_features:
            self.cache.observe(features.start, features.hidden_states)

    def propose(self, committed: list[int], num_tokens: int, stop=None) -> Draft:
        if num_tokens <= 0:
            return Draft(tokens=[])
        if self.noise is not None:
            self.noise.forget_before(len(committed))
        if self.config.tree_nodes:
            return self._propose_tree(committed, num_tokens)
        if self.schedule is None:
            logits = self.cache.forward_to(committed).logits[-1]  # [vocab]
        else:
            logits = self._catch_up(committed)
            num_tokens = min(num_tokens, self._scheduled_length(committed))
        tokens, rows = [], []
        for i in range(num_tokens):
            if self.grammar is not None:
                logits = self.grammar.masked(logits, committed[self.prompt_len:] + tokens)
            if i > 0 and self._is_unsure(logits):
                break
            token, *row = self._choose(logits, len(committed) + i)
            tokens.append(token)
            rows.append(row)
            if i < num_tokens - 1:
                if stop is not None and stop():
                    raise DraftStopped()
                logits = self.cache.extend([token]).logits[-1]
        return self._draft(tokens, rows)

    def propose_many(self, contexts: list[list[int]], budgets: list[int], stop=None
                     ) -> list[Draft]:
        """Drafts after contexts that share a prefix, as rows of one batch per step (a feature
        drafter drafts them one by one); stopped, each row keeps what it has drafted."""
        if self.wants_target_features or len(contexts) < 2:
            return super().propose_many(contexts, budgets, stop)
        shared = min(min(common_prefix_len(contexts[0], c) for c in contexts),
                     min(len(c) for c in contexts) - 1)
        branches = Branches(self.cache, contexts[0][:shared], len(contexts))
        logits = branches.feed([c[shared:] for c in contexts])  # [B, vocab]
        tokens, rows = [[] for _ in contexts], [[] for _ in contexts]
        for i in range(max(budgets)):
            for b, context in enumerate(contexts):
                if len(tokens[b]) == i < budgets[b] and not (i and self._is_unsure(logits[b])):
                    token, *row = self._choose(logits[b], len(context) + i)
                    tokens[b].append(token)
                    rows[b].append(row)
            if i + 1 == max(budgets) or (stop is not None and stop()):
                break  # stopped: every row keeps the tokens drafted so far
            logits = branches.feed([t[i:] if len(t) == i + 1 else [] for t in tokens])
        return [self._draft(t, r) for t, r in zip(tokens, rows)]

    @torch.inference_mode()
    def block_distributions(self, committed: list[int], drafted: list[int]) -> torch.Tensor:
        """Temperature-1 probabilities [len(drafted) + 1, vocab]: one pass over the block for a
        model drafter, a step per token for a feature drafter (it predicts one at a time)."""
        if self.wants_target_features:
            rows = [self.cache.forward_to(committed).logits[-1]]
            rows += [self.cache.extend([token]).logits[-1] for token in drafted]
            logits = torch.stack(rows)
        else:
            logits = self.cache.forward_to(committed + drafted,
                                          num_logits=len(drafted) + 1).logits
        return torch.softmax(logits.float(), dim=-1)

    def _propose_tree(self, committed: list[int], budget: int) -> Draft:
        """A tree of at most ``budget`` nodes (``DraftConfig.tree_shape``; the verifier keeps
        room for ``tree_nodes``, from SessionOpen.tree_nodes)."""
        shape = TreeShape(*self.config.tree_shape(budget, self.depth_left(committed)),
                          self.config.tree_branching)
        if self.recursive:
            tokens, parents, q_ids, q_probs = draft_sampled_tree(self.cache, committed, shape,
                                                                 self._sample_children)
            return Draft(tokens, q_ids, q_probs, parents=parents)
        rank = self._keyed_rank if self.keyed else log_softmax_rank
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
            q = torch.where(alive[:, None], left / mass.clamp_min(1e-300), values.double())
            u = position_uniform(self.sampling.seed, position, STREAM_CHILD_DRAFT + j)
            column = sample_from(q, torch.full((len(q),), u, dtype=torch.float64))  # [F]
            children.append(torch.where(alive, ids.gather(1, column[:, None])[:, 0], -1))
            proposals.append(q.float())
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

    def _is_unsure(self, logits: torch.Tensor) -> bool:
        config = self.config
        if config.min_confidence <= 0.0 and config.max_entropy <= 0.0:
            return False
        probs = torch.softmax(logits.float(), dim=-1)
        if float(probs.max()) < config.min_confidence:
            return True
        entropy = -float(torch.special.xlogy(probs, probs).sum())
        return config.max_entropy > 0.0 and entropy > config.max_entropy

    def _choose(self, logits: torch.Tensor, position: int):
        """One drafted token at ``position``, the sparse q it was drawn from, and the sparse
        temperature-1 distribution a cascade rule decides on when that differs from q (at
        temperature 0: the argmax, with the temperature-1 q when a cascade rule will decide)."""
        if self.sampling.is_greedy:
            if not self.needs_greedy_q:
                return int(logits.argmax()), None, None, None, None
            ids, values = self._temperature_one(logits)
            return int(logits.argmax()), ids, values, None, None
        probs = process_logits(logits.unsqueeze(0), self.sampling)  # [1, vocab]
        if self.keyed:
            return int(keyed_choice(probs, self.noise.rows([position]))[0]), None, None, None, None
        ids, values = sparsify(probs, self.config.max_proposal_tokens)  # [1, K] each
        uniform = position_uniform(self.sampling.seed, position, STREAM_DRAFT)
        column = int(sample_from(values, torch.tensor([uniform], dtype=torch.float64))[0])
        decision = (None, None)
        if self.needs_greedy_q and not self._q_is_temperature_one:
            decision = self._temperature_one(logits)
        return int(ids[0, column]), ids[0], values[0], *decision

    @property
    def _q_is_temperature_one(self) -> bool:
        s = self.sampling
        return s.temperature == 1.0 and s.top_k == 0 and s.top_p >= 1.0

    def _temperature_one(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[K] ids and probs of the drafter's raw (temperature-1) distribution's top K."""
        ids, values = sparsify(torch.softmax(logits.float(), -1)[None],
                               self.config.max_proposal_tokens)
        return ids[0], values[0]

    def _draft(self, tokens: list[int], rows: list) -> Draft:
        """``rows``: per token (q ids, q probs, decision ids, decision probs), None when absent."""
        if not rows or rows[0][0] is None or not self.config.send_proposal:
            return Draft(tokens=tokens)
        q_ids, q_probs, decision_ids, decision_probs = (list(column) for column in zip(*rows))
        draft = Draft(tokens, torch.stack(q_ids), torch.stack(q_probs))
        if decision_ids[0] is not None:
            draft.decision_ids, draft.decision_probs = (torch.stack(decision_ids),
                                                        torch.stack(decision_probs))
        return draft
