"""The bounds every pod holds a generation's settings to (drafts, trees, proposals, stop
tokens, biases, bad words, log-probabilities); the request length rules shared by the HTTP and
gRPC front ends (the prompt must leave room in the context, and the completion must fit in what
is left); and how an error message quotes what the client sent (never all of a long value)."""

from __future__ import annotations

MAX_DRAFT_TOKENS = 32
"""Largest draft length (k) any request, drafter or verifier accepts."""
MAX_ENTROPY = 20.0
"""Bound of DraftConfig.max_entropy (nats; a 2^28-token vocabulary has ln(2^28) = 19.4)."""
MAX_PROPOSAL_TOKENS = 4096
"""Largest support of one sparse proposal q (DraftConfig.max_proposal_tokens, and what a
verifier accepts per drafted token)."""
MAX_NGRAM_N = 16
"""Longest suffix prompt lookup may try (DraftConfig.ngram_max_n). A lookup compares every
window of each length it tries with the suffix, so unbounded it costs O(context^3)."""
MAX_STOP_TOKEN_IDS = 16
"""Stop token ids a session carries (the model's end-of-sequence one included)."""
MAX_LOGIT_BIAS = 100.0
"""Largest logit bias magnitude (OpenAI's bound)."""
MAX_LOGIT_BIAS_TOKENS = 300
"""Most tokens a request may bias (OpenAI's bound)."""
MAX_BAD_WORDS = 64
"""Most banned token sequences a session carries (a word may give two: with and without a
leading space)."""
MAX_BAD_WORD_TOKENS = 16
"""Longest banned token sequence."""
MAX_LOGPROBS = 20
"""Most alternatives a request may ask the log-probabilities of (OpenAI's limit)."""
MAX_TREE_NODES = 64
"""Most nodes a token tree may carry (chains stay within MAX_DRAFT_TOKENS)."""
MAX_TREE_BRANCHING = 16
TREE_EXPANSIONS = ("dynamic", "confidence")
"""How a model drafter grows a tree: EAGLE-2's dynamic expansion (every depth's best
frontier nodes fed and expanded) or CAPE's confidence-aware one (the drafter's chain plus, at
each position, as many runners-up as its confidence asks for; drafted at a chain's cost)."""


QUOTED_CHARS = 64
"""The most characters of a client's value an error message quotes."""


def shortened(text: str, limit: int = QUOTED_CHARS) -> str:
    """``text`` cut to ``limit`` characters (and "..."), for an error message: a message that
    quoted a 1 MB field whole would be a 1 MB answer (and a 1 MB log line)."""
    return text if len(text) <= limit else f"{text[:limit]}..."


class RequestInvalid(ValueError):
    """A request the client must change; ``param`` names the field, ``code`` follows OpenAI's."""

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


def fit_lengths(num_prompt: int, max_tokens: int | None, context: int, limit: int,
                prompt_field: str = "prompt", max_field: str = "max_tokens") -> int:
    """The number of tokens to generate: ``max_tokens``, or when it is None as many as fit
    (at most ``limit``). Raises RequestInvalid when the prompt or the completion cannot fit."""
    if max_tokens is not None and not 1 <= max_tokens <= limit:
        raise RequestInvalid(f"Invalid value for '{max_field}': must be in [1, {limit}], got "
                             f"{max_tokens}.", max_field)
    if num_prompt == 0:
        raise RequestInvalid(f"The '{prompt_field}' produced no tokens; it must not be empty.",
                             prompt_field)
    if num_prompt >= context:
        raise RequestInvalid(
            f"This model's maximum context length is {context} tokens, and the "
            f"'{prompt_field}' alone is {num_prompt} tokens, leaving no room for the "
            f"completion. Please shorten the {prompt_field}.",
            prompt_field, code="context_length_exceeded")
    if max_tokens is None:
        return min(limit, context - num_prompt)
    if num_prompt + max_tokens > context:
        raise RequestInvalid(
            f"This model's maximum context length is {context} tokens. However, you "
            f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the {prompt_field}, "
            f"{max_tokens} for the completion via '{max_field}'). Please reduce the "
            f"{prompt_field} or {max_field}.",
            max_field, code="context_length_exceeded")
    return max_tokens
