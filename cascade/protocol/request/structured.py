"""A request's structured output, checked once for both front ends (HTTP and gRPC)."""

from __future__ import annotations

from dataclasses import replace

from cascade.protocol.grammar import Grammar, grammar_problem
from cascade.protocol.limits import RequestInvalid
from cascade.protocol.request.mapping import GenerationRequest


def with_grammar(request: GenerationRequest, grammar: Grammar | None,
                 field: str) -> GenerationRequest:
    """The request with its output constrained to ``grammar`` (None: unchanged).
    RequestInvalid names ``field`` (where the client sent the grammar) when it does not
    compile, and the conflicting field when the request cannot honour it: a speculative
    cascade would emit the drafter's unmasked tokens, and min_tokens could forbid the end a
    complete grammar allows alone; bad_words could ban every token the grammar allows next,
    leaving no token to emit."""
    if grammar is None:
        return request
    problem = grammar_problem(grammar)
    if problem is not None:
        raise RequestInvalid(f"Invalid value for '{field}': {problem}.", field)
    if request.acceptance is not None and not request.acceptance.rule.is_lossless:
        raise RequestInvalid("Invalid value for 'acceptance': a structured output is generated "
                             "with lossless acceptance only (a speculative cascade keeps the "
                             "drafter's tokens, which the grammar does not mask).", "acceptance")
    if request.sampling.min_tokens:
        raise RequestInvalid("Invalid value for 'min_tokens': not with a structured output "
                             "(the grammar decides where the text ends); send 0.", "min_tokens")
    if request.sampling.bad_words:
        raise RequestInvalid("Invalid value for 'bad_words': not with a structured output "
                             "(the grammar decides which tokens may come, and banned words "
                             "could leave none); send [] or constrain the text in the "
                             "grammar.", "bad_words")
    return replace(request, sampling=replace(request.sampling, grammar=grammar))
