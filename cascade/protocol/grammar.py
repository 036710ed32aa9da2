"""Structured outputs: the grammar a generation's text must match (no torch).

A ``Grammar`` is what a request asked for, as it asked: a JSON schema, any JSON object, a
regular expression, a Lark grammar or a choice among strings. It travels in the session's
settings (``SamplingParams.grammar``, ``Sampling.grammar`` on the wire) to the verifier, whose
grammar processor (``cascade.core.sample.grammar``) masks the target's logits with it at every position
of a block. ``to_llguidance`` turns it into the grammar llguidance compiles; ``grammar_problem``
says what is wrong with one (None: nothing), so the gateway and the pods refuse the same bad
grammar with the same message.

JSON is generated compact (no whitespace between tokens, llguidance's
``whitespace_flexible: false``): the object is the same, and a model cannot pad it forever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llguidance import LLMatcher

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

from cascade.protocol.limits import shortened

GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "lark", "choice")
"""json_schema: ``spec`` is a JSON schema (as JSON text); json_object: any JSON object (``spec``
empty); regex: ``spec`` is a regular expression (Rust regex syntax, matched whole); lark:
``spec`` is a Lark grammar (llguidance's dialect, start rule ``start``); choice: ``spec`` is a
JSON list of strings, the text is one of them."""
MAX_GRAMMAR_CHARS = 65536
"""Longest grammar text (``spec``) a request may send."""
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Grammar:
    """The grammar a generation's text must match."""

    kind: str
    """One of GRAMMAR_KINDS."""
    spec: str = ""
    """The grammar's text (empty for json_object)."""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"kind must be one of {', '.join(GRAMMAR_KINDS)}, got "
                             f"{shortened(self.kind)!r}")
        if len(self.spec) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"spec is {len(self.spec)} characters; at most {MAX_GRAMMAR_CHARS}")

    @classmethod
    def json_schema(cls, schema: dict) -> Grammar:
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def choice(cls, options: list[str]) -> Grammar:
        return cls("choice", json.dumps(options))


def to_llguidance(grammar: Grammar) -> str:
    """The grammar as llguidance's serialized grammar (ValueError: the spec is not what its kind
    needs, e.g. a schema that is not JSON)."""
    if grammar.kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if grammar.kind == "json_schema":
        schema = _json(grammar.spec, "a JSON schema")
        if not isinstance(schema, dict):  # `true` / `false` too: the options need an object
            raise ValueError("a JSON schema must be a JSON object")
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if grammar.kind == "regex":
        return LLMatcher.grammar_from_regex(grammar.spec)
    if grammar.kind == "lark":
        return LLMatcher.grammar_from_lark(grammar.spec)
    return LLMatcher.grammar_from_lark(_choice_lark(grammar.spec))


PROBLEM_CHARS = 240
"""The most of a compiler's message an error passes on (llguidance quotes the grammar: a
20,000-character regex made a 60,000-character message)."""


def grammar_problem(grammar: Grammar) -> str | None:
    """What makes ``grammar`` unusable (malformed, or a feature llguidance does not support),
    cut to PROBLEM_CHARS; None when it compiles."""
    try:
        is_error, messages = LLMatcher.validate_grammar_with_warnings(to_llguidance(grammar))
    except ValueError as exc:
        return shortened(str(exc), PROBLEM_CHARS)
    return shortened(messages[0].strip(), PROBLEM_CHARS) if is_error else None


def _json(text: str, what: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} must be valid JSON ({exc})") from None


def _choice_lark(spec: str) -> str:
    """A Lark grammar whose language is exactly the listed strings."""
    options = _json(spec, "a choice")
    if (not isinstance(options, list) or not options
            or not all(isinstance(o, str) and o for o in options)):
        raise ValueError("a choice must be a non-empty list of non-empty strings")
    return "start: " + " | ".join(json.dumps(o) for o in options)
