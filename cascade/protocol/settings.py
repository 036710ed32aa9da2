"""Settings of one generation: sampling and drafting (no torch; the acceptance policy is
``cascade.protocol.acceptance``).

These frozen dataclasses are built once at the edge (the request mapping, or a test) and travel
unchanged to the drafter and the verifier; each checks its own ranges and names the field.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from enum import Enum

from cascade.protocol.grammar import Grammar
from cascade.protocol.methods import (
    DRAFT_METHODS,
    LOOKUP_TOKENS,
    MEMORY_METHODS,
    MODEL_METHOD,
    PREDICTION_METHODS,
    PREDICTION_TOKENS,
)
from cascade.protocol.acceptance import TREE_RULES, AcceptancePolicy, AcceptanceRule
from cascade.protocol.limits import (
    MAX_DRAFT_TOKENS,
    MAX_ENTROPY,
    MAX_PROPOSAL_TOKENS,
    MAX_NGRAM_N,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_TREE_NODES,
    MAX_TREE_BRANCHING,
    TREE_EXPANSIONS,
)


class FinishReason(str, Enum):
    STOP = "stop"
    """A stop token (end of sequence) was generated."""
    LENGTH = "length"
    """max_new_tokens was reached."""


def as_float32(value: float) -> float:
    """``value`` as a float32 wire field carries it (the nearest float32; infinite beyond)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


MIN_TEMPERATURE = as_float32(1e-5)
"""Smallest positive temperature: below it logits / temperature can overflow float32 and the
probabilities become NaN. The request mapping turns smaller ones into 0 (greedy). It is 1e-5
as float32 stores it (9.99999975e-6): the wire carries temperatures as float32, so a value the
gateway accepts must still be in range after that rounding."""


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; applied identically to the target (p) and the drafter (q)."""

    temperature: float = 0.0
    """0 selects greedy decoding; otherwise logits are divided by it. Range [0, 100]."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches top_p. Range (0, 1]."""
    seed: int = 0
    """Seeds the per-position random numbers, so a run is reproducible."""
    max_new_tokens: int = 64
    """Most tokens to generate after the prompt. At least 1."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after any of these tokens (it is kept in the output)."""
    logprobs: int | None = None
    """Return the target's log-probability of every emitted token and of this many most
    likely alternatives, in [0, MAX_LOGPROBS] (None: none)."""
    min_tokens: int = 0
    """No stop token is chosen before this many tokens were generated (the target's
    probability of each is 0 there)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias in [-100, 100]) added to the target's logits at every position before
    anything else (temperature, top-k/top-p, acceptance)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token generated before the position, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted once per earlier occurrence in the generated tokens, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """Divides positive (multiplies negative) logits of tokens in the prompt or generated
    before the position, in (0, 10]; 1 is none."""

    bad_words: tuple[tuple[int, ...], ...] = ()
    """Token sequences never generated: a sequence's last token is banned wherever the tokens
    before the position end with the rest of it (a one-token sequence: everywhere)."""
    grammar: Grammar | None = None
    """Structured output: the text must match this grammar (the verifier masks every token
    that would leave it; cascade.core.sample.grammar). None: free text."""
    prompt_logprobs: int | None = None
    """Also the target's log-probability of every prompt token after the first and of this many
    alternatives, in [0, MAX_LOGPROBS] (None: none; ``echo``; cascade.core.verify.logprobs)."""

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or self.bad_words)

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise ValueError(f"repetition_penalty must be in (0, 10], got "
                             f"{self.repetition_penalty}")
        if any(not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for _, b in self.logit_bias):
            raise ValueError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS}, "
                             f"{MAX_LOGIT_BIAS}]")
        if isinstance(self.grammar, dict):  # as a stored record's JSON has it
            object.__setattr__(self, "grammar", Grammar(**self.grammar))
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got "
                                 f"{getattr(self, name)}")
        if not (self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be 0 (greedy) or in [1e-05, 100], "
                             f"got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def max_drafts_after(self, num_generated: int) -> int:
        """Drafted tokens worth verifying once ``num_generated`` tokens exist: every round also
        emits one token of the verifier's, and the total stops at max_new_tokens."""
        return max(0, self.max_new_tokens - num_generated - 1)

    def stops_allowed_at(self, generated_index: int) -> bool:
        """Whether a stop token may be chosen as generated token ``generated_index`` (0-based)."""
        return generated_index >= self.min_tokens

    def finish_after(self, generated: list[int]) -> FinishReason | None:
        """Why a generation that produced ``generated`` has ended (None: it has not): its last
        token is a stop token, or it is max_new_tokens long (the verifier's own rule)."""
        if generated and generated[-1] in self.stop_token_ids:
            return FinishReason.STOP
        return FinishReason.LENGTH if len(generated) >= self.max_new_tokens else None


@dataclass(frozen=True)
class DraftConfig:
    """How a drafter proposes blocks."""

    num_draft_tokens: int = 4
    """Tokens drafted per round (k), in [0, 32]; 0 means the target decodes alone."""
    max_proposal_tokens: int = 64
    """Cap on the support of the sparse proposal q sent per drafted token (top-K), in
    [1, MAX_PROPOSAL_TOKENS]."""
    send_proposal: bool = True
    """Send q with sampled drafts; without it the verifier treats q as a point mass."""
    min_confidence: float = 0.0
    """Stop a block early when the drafter's top probability falls below this, in [0, 1)."""
    max_entropy: float = 0.0
    """Stop a block early when the entropy of the drafter's temperature-1 distribution (nats)
    rises above this, in [0, 20]; 0 turns the check off."""
    adaptive: bool = False
    """Adapt k to the drafter's recent success, within ``adaptive_bounds`` (model drafters)."""
    planned: bool = False
    """The verifier's goodput planner picks each round's length in [0, k] (the "auto"
    schedule, cascade.core.plan.goodput); not with ``adaptive``."""
    method: str = MODEL_METHOD
    """The proposer, by name: one of cascade.protocol.methods.DRAFT_METHODS."""
    ngram_max_n: int = 4
    """Longest context suffix prompt lookup tries to match, in [ngram_min_n, MAX_NGRAM_N]."""
    ngram_min_n: int = 2
    """Shortest suffix it accepts as a match, in [1, ngram_max_n]."""
    tree_nodes: int = 0
    """Draft a token tree of at most this many nodes, depth at most k (the greedy, keyed or
    recursive rule; prompt lookup: every earlier match as a branch), in [0, MAX_TREE_NODES];
    0 drafts a chain."""
    tree_branching: int = 4
    """Children a tree node offers, and nodes kept per depth, in [1, MAX_TREE_BRANCHING]."""
    tree_expansion: str = "dynamic"
    """How the model drafter grows trees: one of TREE_EXPANSIONS ("confidence" ignores
    ``tree_branching``: each position's width comes from the drafter's confidence)."""
    prediction: tuple[int, ...] = ()
    """The client's predicted output (token ids; OpenAI's Predicted Outputs), drafted from by
    the methods in PREDICTION_METHODS wherever the output joins it."""

    def __post_init__(self) -> None:
        if not 0 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(
                f"num_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], got {self.num_draft_tokens}"
            )
        if not 1 <= self.max_proposal_tokens <= MAX_PROPOSAL_TOKENS:
            raise ValueError(f"max_proposal_tokens must be in [1, {MAX_PROPOSAL_TOKENS}], "
                             f"got {self.max_proposal_tokens}")
        if not 0.0 <= self.min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1), got {self.min_confidence}")
        if not 0.0 <= self.max_entropy <= MAX_ENTROPY:
            raise ValueError(f"max_entropy must be in [0, {MAX_ENTROPY}], got {self.max_entropy}")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n <= MAX_NGRAM_N:
            raise ValueError(f"need 1 <= ngram_min_n <= ngram_max_n <= {MAX_NGRAM_N}, got "
                             f"ngram_min_n {self.ngram_min_n} and ngram_max_n "
                             f"{self.ngram_max_n}")
        method = getattr(self.method, "value", self.method)
        if method not in DRAFT_METHODS:
            raise ValueError(f"draft method must be one of {sorted(DRAFT_METHODS)}, got {method!r}")
        object.__setattr__(self, "method", method)
        if self.prediction and method not in PREDICTION_METHODS:
            raise ValueError(f"a predicted output is drafted from by draft method(s) "
                             f"{sorted(PREDICTION_METHODS)}, not {method!r}")
        object.__setattr__(self, "prediction", tuple(self.prediction))
        self._check_tree()
        if self.planned and self.adaptive:
            raise ValueError("a draft schedule is planned by the verifier or adaptive on the "
                             "drafter, not both")

    def tree_shape(self, budget: int, depth_left: int) -> tuple[int, int]:
        """(nodes, depth) of a tree drafted with ``budget`` nodes (which a planning verifier
        may lower) when at most ``depth_left`` drafted tokens can still be emitted: only the
        depth is bounded by what is left, since a round emits one path, not every node."""
        return min(self.tree_nodes, budget), min(self.num_draft_tokens, budget, depth_left)

    def _check_tree(self) -> None:
        if not 0 <= self.tree_nodes <= MAX_TREE_NODES:
            raise ValueError(f"tree_nodes must be in [0, {MAX_TREE_NODES}], got {self.tree_nodes}")
        if not 1 <= self.tree_branching <= MAX_TREE_BRANCHING:
            raise ValueError(f"tree_branching must be in [1, {MAX_TREE_BRANCHING}], got "
                             f"{self.tree_branching}")
        if self.tree_expansion not in TREE_EXPANSIONS:
            raise ValueError(f"tree_expansion must be one of {list(TREE_EXPANSIONS)}, got "
                             f"{self.tree_expansion!r}")
        if self.tree_nodes and self.adaptive:
            raise ValueError("tree_nodes: token trees are drafted with a fixed k (not "
                             "adaptive)")

    def check(self, policy: AcceptancePolicy) -> None:
        """Raises ValueError when this drafting cannot serve ``policy``: a speculative cascade
        (a lossy rule) decides on the drafter model's distribution, which only the model method
        sends with every block."""
        if self.tree_nodes and policy.rule not in TREE_RULES:
            raise ValueError(f"tree_nodes: a token tree is verified with the greedy, keyed or "
                             f"recursive rule, not {policy.rule.value}; send tree_nodes 0 for a "
                             f"chain")
        if (self.tree_nodes and self.tree_expansion != "dynamic"
                and policy.rule is AcceptanceRule.RECURSIVE):
            raise ValueError(f"tree_expansion: the recursive rule samples every node's children "
                             f"from q, so its trees grow one way only; send 'dynamic', not "
                             f"{self.tree_expansion!r}")
        if policy.rule is AcceptanceRule.RECURSIVE and self.method != MODEL_METHOD:
            raise ValueError(f"the recursive rule verifies against the drafter's q, which only "
                             f"draft method '{MODEL_METHOD}' sends, got '{self.method}'")
        if not policy.rule.is_lossless and self.method != MODEL_METHOD:
            raise ValueError(f"a speculative cascade decides on the drafter model's "
                             f"distribution, so it needs draft method '{MODEL_METHOD}', "
                             f"got '{self.method}'")

    @property
    def adaptive_bounds(self) -> tuple[int, int]:
        """The range an adaptive block length moves in: [1, min(2k, MAX_DRAFT_TOKENS)]."""
        return 1, min(2 * self.num_draft_tokens, MAX_DRAFT_TOKENS)

    def budget(self, sampling: SamplingParams, num_generated: int) -> int:
        """The one draft-length rule: at most k (at most the adaptive bound when adaptive; the
        proposer's schedule picks within it; a tree's nodes at most ``tree_nodes``, its depth
        at most k and the budget, ``tree_shape``), and only drafts that can still be emitted
        (the request mapping already keeps prompt + max_new_tokens inside the context); a
        tree keeps its nodes to the end, its depth is what is bounded (``tree_shape``)."""
        left = sampling.max_drafts_after(num_generated)
        if self.tree_nodes:
            return self.tree_nodes if left else 0
        return min(self.longest_block, left)

    @property
    def longest_block(self) -> int:
        """The most tokens (a tree's nodes) a block may carry: k, the adaptive bound, a tree's
        nodes, or for the memory methods' chains LOOKUP_TOKENS (PREDICTION_TOKENS with a
        prediction; when k > 0)."""
        if self.tree_nodes:
            return self.tree_nodes
        most = self.adaptive_bounds[1] if self.adaptive else self.num_draft_tokens
        if self.prediction and most:
            return max(most, PREDICTION_TOKENS)
        if self.method in MEMORY_METHODS and most:
            return max(most, LOOKUP_TOKENS)
        return most
