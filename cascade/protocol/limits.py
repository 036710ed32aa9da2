"""Request length rules shared by the HTTP and gRPC front ends: the prompt must leave room in the
context, and the completion must fit in what is left; and how an error message quotes what the
client sent (never all of a long value)."""

from __future__ import annotations


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
