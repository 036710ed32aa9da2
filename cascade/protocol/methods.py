"""The drafting methods a drafter can run, by name, and where each proposer is implemented.

This table is the one registration of a proposer: the request mapping validates names against
it without importing torch, and the drafter imports the implementation when a session asks for
it (``cascade.core.proposers.load``). Adding a method is one module and one line here.
"""

from __future__ import annotations

DRAFT_METHODS: dict[str, str] = {
    # the drafter model proposes every block (with its sparse q when sampling)
    "model": "cascade.core.proposers.model:ModelProposer",
    # prompt lookup: what followed the last match of the context's suffix (no model, no q)
    "ngram": "cascade.core.proposers.ngram:NgramProposer",
    # prompt lookup when it finds a match, else the drafter model
    "ngram_then_model": "cascade.core.proposers.ngram:NgramThenModelProposer",
    # suffix decoding: the session's own tokens and the pod's speculation memory (no model)
    "suffix": "cascade.core.proposers.suffix:SuffixProposer",
    # the memory when its draft scores high, else the drafter model (per round)
    "suffix_then_model": "cascade.core.proposers.suffix:SuffixThenModelProposer",
    # each round, whichever source expects the most tokens per second: the memory and the
    # session's own tokens, the client's predicted output, the drafter model
    "auto": "cascade.core.proposers.auto:AutoProposer",
}
"""name -> "module:Class" of its cascade.core.proposers.Proposer subclass."""

DRAFT_SOURCES = ("model", "ngram", "suffix", "memory", "prediction")
"""What can draft a block (``Round.draft_source``): the drafter model, prompt lookup, the
session's own tokens, the speculation memory, the request's predicted output."""

DEFAULT_DRAFT_METHOD = "auto"
MODEL_METHOD = "model"
"""The method whose every block carries the drafter model's q: what a speculative cascade, the
recursive rule and the adaptive schedule need."""

LOOKUP_TOKENS = 16
"""Longest chain the suffix methods draft from a match (vLLM's suffix method drafts up to
16-32): a match's own probabilities end it sooner where earlier text diverged, so k bounds
only what the drafter model drafts."""
PREDICTION_TOKENS = 32
"""Longest block drafted from a client's predicted output (MAX_DRAFT_TOKENS): a prediction is
usually right for long stretches, and the verifier's plan cuts a block to what pays."""
PREDICTION_METHODS = frozenset({"auto"})
"""Methods that draft from a client's predicted output (``DraftConfig.prediction``)."""
MEMORY_METHODS = frozenset({"suffix", "suffix_then_model", "auto"})
"""Methods that draft from the speculation memory (their blocks may reach LOOKUP_TOKENS)."""
SELF_ESTIMATED_METHODS = frozenset({"suffix"})
"""Methods every draft of which carries its own survival estimates and costs nothing to make:
a planning verifier decodes their sessions alone until the drafter says a draft is ready."""
