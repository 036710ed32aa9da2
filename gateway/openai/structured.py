"""Structured-output fields of the HTTP API: OpenAI's ``response_format`` and vLLM's
``structured_outputs`` (and its older ``guided_*`` names), each turned into one ``Grammar``.

| field | grammar |
|---|---|
| response_format {"type": "text"} | none |
| response_format {"type": "json_object"} | any JSON object |
| response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} | the schema (strict or not: the output always matches it) |
| structured_outputs {"json": schema} / guided_json | the schema (an object, or its JSON text) |
| structured_outputs {"json_object": true} | any JSON object |
| structured_outputs {"regex": ...} / guided_regex | the regular expression (Rust syntax), matched whole |
| structured_outputs {"grammar": ...} / guided_grammar | a Lark grammar (llguidance's dialect; start rule ``start``) |
| structured_outputs {"choice": [...]} / guided_choice | exactly one of the strings |

A request sets at most one of them (and structured_outputs one key).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from cascade.protocol.grammar import Grammar
from cascade.protocol.limits import RequestInvalid
from cascade.protocol.request.options import Lenient


class Strict(Lenient):
    """A part of a structured-output field: unknown keys are refused (a misspelt key would
    otherwise leave the output unconstrained)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class JsonSchemaFormat(Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('"json_schema" is required with type "json_schema" and only '
                             'with it')
        return self


class StructuredOutputs(Strict):
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputs:
        if len(self.model_fields_set) > 1:
            raise ValueError("set one of json, json_object, regex, grammar or choice")
        return self


class StructuredFields(Lenient):
    """The structured-output fields a completions or chat request may carry."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None

    def requested_grammar(self) -> tuple[Grammar, str] | None:
        """The grammar asked for and the field it came in (None: free text); RequestInvalid
        names the field when it is malformed or more than one field asks."""
        found = []
        for field, build in self._sources():
            try:
                grammar = build()
            except ValueError as exc:
                raise RequestInvalid(f"Invalid value for '{field}': {exc}.", field) from exc
            if grammar is not None:
                found.append((grammar, field))
        if len(found) > 1:
            raise RequestInvalid(f"Invalid value for '{found[1][1]}': a request sets one of "
                                 f"response_format, structured_outputs and guided_*, got "
                                 f"'{found[0][1]}' too.", found[1][1])
        return found[0] if found else None

    def _sources(self) -> list[tuple[str, Callable[[], Grammar | None]]]:
        structured = self.structured_outputs
        key = next(iter(structured.model_fields_set), "") if structured else ""
        fmt = self.response_format
        return [
            ("response_format.json_schema.schema" if fmt and fmt.json_schema
             else "response_format", lambda: _from_response_format(fmt)),
            (f"structured_outputs.{key.rstrip('_')}".rstrip("."),
             lambda: _from_structured(structured)),
            ("guided_json", lambda: _schema(self.guided_json)),
            ("guided_regex", lambda: _maybe("regex", self.guided_regex)),
            ("guided_grammar", lambda: _maybe("lark", self.guided_grammar)),
            ("guided_choice", lambda: _choice(self.guided_choice)),
        ]


def _from_response_format(value: ResponseFormat | None) -> Grammar | None:
    if value is None or value.type == "text":
        return None
    if value.json_schema is None:  # json_object (the model refuses json_schema without one)
        return Grammar("json_object")
    return Grammar.json_schema(value.json_schema.schema_)


def _from_structured(value: StructuredOutputs | None) -> Grammar | None:
    if value is None:
        return None
    if value.json_object:
        return Grammar("json_object")
    return (_schema(value.json_) or _maybe("regex", value.regex)
            or _maybe("lark", value.grammar) or _choice(value.choice))


def _schema(value: dict[str, Any] | str | None) -> Grammar | None:
    if value is None:
        return None
    return Grammar("json_schema", value if isinstance(value, str) else json.dumps(value))


def _maybe(kind: str, spec: str | None) -> Grammar | None:
    return None if spec is None else Grammar(kind, spec)


def _choice(options: list[str] | None) -> Grammar | None:
    return None if options is None else Grammar.choice(options)
