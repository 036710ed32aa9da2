"""Tool calls on /v1/chat/completions: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

The tools go to the model through its chat template (``apply_chat_template(tools=...)``); a
template that does not use them gets them in a system message instead (``with_tools``), with the
format below. What the model writes is read back as tool calls (``parse_tool_calls``) in either
of the formats open models use:

- Hermes/Qwen tags: one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- bare JSON: the whole text is ``{"name": ..., "arguments": {...}}`` ("parameters" is read as
  "arguments" too), or a list of such objects.

A call names one of the request's tools and its arguments are a JSON object; anything else is
plain content. ``tool_choice``:

| value | prompt | output |
|---|---|---|
| "none" (default without tools) | no tools | free text, never parsed |
| "auto" (default with tools) | tools | free text; tool calls when it is one |
| "required" | tools | constrained (structured outputs) to a JSON list of one or more calls (one when parallel_tool_calls is false), each {"name": a tool's name, "arguments": its parameters' schema} |
| {"type": "function", "function": {"name": N}} | tools | constrained to {"name": N, "arguments": N's parameters' schema} |

Calls come back as ``message.tool_calls`` (id, type "function", function.name,
function.arguments as JSON text) with content null and finish_reason "tool_calls"; a stream
holds the text back and sends each call as OpenAI does (a chunk with its id and name, then one
with its arguments). A generation cut by max_tokens is returned as text (finish_reason
"length").
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from cascade.protocol.grammar import Grammar
from cascade.protocol.limits import RequestInvalid, shortened
from cascade.protocol.request.options import Lenient

NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
"""The parameters of a function that declares none."""
TAGGED_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOLS_PROMPT = ("You can call these tools. To call one, answer with only a JSON object "
                '{"name": <the tool\'s name>, "arguments": <its arguments>}.\nTools: ')


class FunctionDef(Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: dict(NO_PARAMETERS))
    strict: bool | None = None


class Tool(Lenient):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: FunctionName


class ToolFields(Lenient):
    """The tool fields of a chat request."""

    tools: list[Tool] = Field(default_factory=list, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, value, info: ValidationInfo):
        names = [t.function.name for t in info.data.get("tools") or []]
        if value not in (None, "none") and not names:
            raise ValueError('needs "tools"')
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise ValueError(f"names function {shortened(value.function.name)!r}, which is not "
                             f"in \"tools\" ({shortened(', '.join(names))})")
        return value

    @property
    def tool_mode(self) -> str:
        """"none", "auto", "required" or "function"."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return "function"
        return self.tool_choice or ("auto" if self.tools else "none")

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The tools whose calls are read back (none when tool_choice is "none")."""
        return () if self.tool_mode == "none" else tuple(t.function.name for t in self.tools)

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them (None: render none)."""
        if self.tool_mode == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def tool_grammar(self) -> Grammar | None:
        """The structured output "required" and a named function impose (None: none);
        RequestInvalid names tools when it cannot be one (its schemas are too large)."""
        try:
            return self._calls_grammar()
        except ValueError as exc:
            raise RequestInvalid(f"Invalid value for 'tools': tool_choice "
                                 f"{self.tool_mode!r} makes their schemas the output's grammar, "
                                 f"which {exc}; send fewer or smaller parameter schemas.",
                                 "tools") from exc

    def _calls_grammar(self) -> Grammar | None:
        by_name = {t.function.name: t.function.parameters for t in self.tools}
        if isinstance(self.tool_choice, NamedToolChoice):  # tool_mode "function"
            name = self.tool_choice.function.name
            return Grammar.json_schema(_call_schema(name, by_name[name]))
        if self.tool_mode != "required":
            return None
        calls = {"type": "array", "minItems": 1,
                 "items": {"anyOf": [_call_schema(n, p) for n, p in by_name.items()]}}
        if not self.parallel_tool_calls:
            calls["maxItems"] = 1
        return Grammar.json_schema(calls)


def _call_schema(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               template: str) -> list[dict[str, Any]]:
    """``messages`` for a template that does not render tools: the tools (and earlier calls)
    written into the text, as ``TOOLS_PROMPT`` says."""
    if not tools or "tools" in template:
        return messages
    system = {"role": "system", "content": TOOLS_PROMPT + json.dumps(tools)}
    return [system] + [_calls_as_text(m) for m in messages]


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    text = json.dumps([{"name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"] or "{}")}
                       for c in calls])
    return {**message, "content": (message.get("content") or "") + text}


def parse_tool_calls(text: str, names: tuple[str, ...]) -> list[dict[str, Any]] | None:
    """The tool calls ``text`` makes, in OpenAI's shape (None: it is not tool calls)."""
    if not names:
        return None
    tagged = TAGGED_CALL.findall(text)
    parts = tagged if tagged and not TAGGED_CALL.sub("", text).strip() else [text]
    calls = []
    for part in parts:
        try:
            value = json.loads(part)
        except json.JSONDecodeError:
            return None
        for call in value if isinstance(value, list) else [value]:
            parsed = _one_call(call, names)
            if parsed is None:
                return None
            calls.append(parsed)
    return calls or None


def _one_call(call: Any, names: tuple[str, ...]) -> dict[str, Any] | None:
    if not isinstance(call, dict) or call.get("name") not in names:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call["name"],
                         "arguments": json.dumps(arguments, ensure_ascii=False)}}


def tool_calls_of(names: tuple[str, ...], text: str, finish_reason: str | None
                  ) -> list[dict[str, Any]] | None:
    """The calls of a whole generation (None: none, or it was cut before its end)."""
    return parse_tool_calls(text, names) if finish_reason == "stop" else None


def streamed_calls(calls: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``delta.tool_calls`` of the chunks that send ``calls``: for each, its id, type and name
    with empty arguments, then its arguments."""
    deltas = []
    for index, call in enumerate(calls):
        name = {"name": call["function"]["name"], "arguments": ""}
        deltas.append([{"index": index, "id": call["id"], "type": "function",
                        "function": name}])
        deltas.append([{"index": index,
                        "function": {"arguments": call["function"]["arguments"]}}])
    return deltas
