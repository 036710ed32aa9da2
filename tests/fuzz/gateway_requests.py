"""Hypothesis strategies for what clients send the gateway: OpenAI-style JSON bodies for
/v1/completions and /v1/chat/completions, and the gRPC GenerateRequest; plus the generator the
gateway under test runs them on, and the gateway's gRPC service in front of such a generator.

A body is a valid request with up to two fields (``broken``) replaced by anything JSON can hold
(wrong types, huge and negative numbers, ints past the wire's 32 bits, floats that round out of
range at the wire's float32, NaN and Infinity literals, lone surrogates, digits that are not
ASCII, control tokens, deep nesting), or not a request at all (random JSON, bytes that are not
JSON).

The generator behind the gateway checks every request it is given as the pods will
(``pods_refusal``): what the gateway accepts, the pods must run as it was asked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from hypothesis import strategies as st

from cascade.protocol.methods import DRAFT_METHODS
from cascade.protocol.request.mapping import GenerationRequest
from cascade.protocol.request.options import CASCADE_RULE_NAMES
from cascade.protocol.settings import FinishReason, as_float32
from cascade.protocol.wire.validation import ModelLimits, draft_config, session_settings
from cascade.protocol.wire.convert import acceptance_to_pb, draft_settings_to_pb, sampling_to_pb
from cascade.serving.server import GrpcService, ServiceBinding
from cascade.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2
from gateway.sessions.generation import GeneratedChunk
from gateway.grpc_api import GatewayServicer
from gateway.settings import HttpSettings
from gateway.server import SERVICE_NAME
from harness import BackgroundLoop
from server_defaults import server_defaults

MODEL = "tiny-model"
CONTEXT = 1024
MAX_TOKENS_LIMIT = 32
HTTP_SETTINGS = HttpSettings(model_name=MODEL, context_length=CONTEXT,
                             max_tokens_limit=MAX_TOKENS_LIMIT, playground=False)
CONTROL_TOKENS = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>")

TEXTS = st.one_of(
    st.sampled_from(["Hello world", "The quick brown fox", "naïve café 日本語", "a" * 40]),
    st.text(min_size=1, max_size=12).filter(str.strip),
    st.lists(st.sampled_from([*CONTROL_TOKENS, "hi ", "there"]), min_size=1, max_size=6)
    .map("".join),
)
FLOAT32_ROUNDED = [1e-50, 1e-46, 0.99999999, 1 - 2**-30, 2.0000000001, 1e-40]
"""Valid as doubles, but 0, 1, or the bound itself once the wire rounds them to float32."""
EXTREME_NUMBERS = st.sampled_from([-1, 0, 1, 2**31, 2**32, 2**40, 2**63, 2**64, -(2**63) - 1,
                                   10**30, -1e308, 1e308, 1e-320, 0.5, -0.0, 3.0,
                                   *FLOAT32_ROUNDED])
NON_ASCII_DIGITS = st.sampled_from(["\u00b2", "\u0661", "\u00b9\u00b2", "\U0001d7d9", "\u0663\u0665"])
"""str.isdigit accepts them, int() does not (superscripts, Arabic-Indic, mathematical)."""
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXTS,
                        st.text(max_size=12), st.just("\ud800"), st.just("\udfff x"),
                        EXTREME_NUMBERS, NON_ASCII_DIGITS)
WILD_KEYS = st.one_of(st.text(max_size=8), NON_ASCII_DIGITS, EXTREME_NUMBERS.map(str))
WILD_JSON = st.recursive(JSON_LEAVES, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(WILD_KEYS, children, max_size=4)),
    max_leaves=12)
WILD_VALUES = st.one_of(EXTREME_NUMBERS, st.integers(), JSON_LEAVES, WILD_JSON)
"""What a broken field holds: scalars as often as nested values."""


def broken_fields(names) -> st.SearchStrategy[set[str]]:
    """None, one (most often, so no other error masks it) or two of ``names``."""
    names = st.sampled_from(sorted(names))
    return st.one_of(st.just(set()), st.sets(names, min_size=1, max_size=1),
                     st.sets(names, min_size=1, max_size=1),
                     st.sets(names, min_size=2, max_size=2))


def optional(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


COMMON_FIELDS = {
    "model": st.just(MODEL),
    "max_tokens": optional(st.integers(1, 8)),
    "temperature": optional(st.floats(0.0, 2.0)),
    "top_p": optional(st.floats(0.01, 1.0)),
    "top_k": optional(st.integers(0, 1000)),
    "seed": optional(st.integers(-(2**63), 2**64 - 1)),
    "stop": optional(st.one_of(TEXTS, st.lists(TEXTS, max_size=4))),
    "num_draft_tokens": optional(st.integers(0, 32)),
    "draft_method": optional(st.just("model")),
    "acceptance": optional(st.sampled_from(["lossless", "cascade"])),
    "cascade_rule": optional(st.sampled_from(CASCADE_RULE_NAMES)),
    "cascade_alpha": optional(st.floats(0.0, 1.0)),
    "draft_schedule": optional(st.sampled_from(["auto", "fixed", "adaptive"])),
    "draft_min_confidence": optional(st.floats(0.0, 0.99)),
    "draft_max_entropy": optional(st.floats(0.0, 20.0)),
    "logit_bias": optional(st.dictionaries(st.integers(0, 299).map(str), st.floats(-100, 100),
                                           max_size=3)),
    "min_tokens": optional(st.integers(0, 1)),
    "repetition_penalty": optional(st.floats(0.5, 2.0)),
    "presence_penalty": optional(st.floats(-2.0, 2.0)),
    "stream": optional(st.booleans()),
    "stream_options": optional(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "n": optional(st.just(1)),
    "user": optional(st.text(max_size=10)),
    "response_format": optional(st.sampled_from([
        {"type": "text"}, {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}}}}])),
}
TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({
    "name": st.sampled_from(["get_weather", "f_1"]),
    "parameters": st.just({"type": "object", "properties": {"x": {"type": "string"}}})})}),
    min_size=1, max_size=2)
MESSAGES = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant"]),
    "content": st.one_of(TEXTS, st.lists(TEXTS.map(lambda t: {"type": "text", "text": t}),
                                         min_size=1, max_size=2)),
}), min_size=1, max_size=3)
ENDPOINT_FIELDS = {
    "/v1/completions": {"prompt": st.one_of(TEXTS, TEXTS.map(lambda t: [t]))},
    "/v1/chat/completions": {"messages": MESSAGES,
                             "max_completion_tokens": optional(st.integers(1, 8)),
                             "tools": optional(TOOLS),
                             "tool_choice": optional(st.sampled_from(["none", "auto"]))},
}


@dataclass
class Body:
    """A request body as bytes and the fields given malformed or extreme values (``None``:
    the whole body is not a request)."""

    raw: bytes
    broken: frozenset[str] | None = field(default_factory=frozenset)


@st.composite
def request_bodies(draw, path: str) -> Body:
    """A JSON body for ``path``: a valid request with up to two broken fields, or garbage."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return Body(draw(not_a_request()), None)
    strategies = {**COMMON_FIELDS, **ENDPOINT_FIELDS[path]}
    broken = draw(broken_fields(strategies))
    body = {}
    for name, valid in strategies.items():
        value = draw(WILD_VALUES if name in broken else valid)
        if value is not None or name in broken:
            body[name] = value
    if not body.get("tools") and "tool_choice" not in broken:
        body.pop("tool_choice", None)  # valid only with tools (null or [] is none)
    if (body.get("acceptance") == "cascade" and "acceptance" not in broken
            and "response_format" not in broken):
        body.pop("response_format", None)  # a structured output is generated losslessly only
    if body.get("response_format") and not {"min_tokens", "response_format"} & broken:
        body.pop("min_tokens", None)  # a structured output ends where its grammar does
    if "stream" not in broken and "cascade_rounds" not in broken and body.get("stream"):
        body["cascade_rounds"] = draw(st.booleans())
    return Body(json.dumps(body).encode(), frozenset(broken))


def not_a_request() -> st.SearchStrategy[bytes]:
    """Bodies that are no request object: other JSON values, malformed or deeply nested JSON,
    bytes that are not UTF-8."""
    return st.one_of(
        WILD_JSON.map(lambda value: json.dumps(value).encode()),
        st.binary(max_size=40),
        st.sampled_from([b"", b"{", b'{"model": ', b"[" * 100_000 + b"]" * 100_000,
                         b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"\xff\xfe{}", b"null"]),
    )


# ----- gRPC ----------------------------------------------------------------------------------

WILD_DOUBLES = st.one_of(st.floats(), EXTREME_NUMBERS.map(float))
WILD_STRINGS = st.one_of(st.text(max_size=20), st.sampled_from(["telepathy", "CASCADE", " "]))
GRPC_FIELDS = {
    "model": (st.sampled_from(["", MODEL]), WILD_STRINGS),
    "prompt": (TEXTS, st.one_of(st.just(""), st.text(max_size=20), st.just("hello " * 2000))),
    "max_tokens": (optional(st.integers(1, 8)), st.integers(0, 2**32 - 1)),
    "num_draft_tokens": (optional(st.integers(0, 32)), st.integers(0, 2**32 - 1)),
    "temperature": (optional(st.floats(0.0, 2.0)), WILD_DOUBLES),
    "top_p": (optional(st.floats(0.01, 1.0)), WILD_DOUBLES),
    "top_k": (optional(st.integers(0, 1000)), st.integers(0, 2**32 - 1)),
    "seed": (optional(st.integers(0, 2**64 - 1)), st.integers(0, 2**64 - 1)),
    "cascade_alpha": (optional(st.floats(0.0, 1.0)), WILD_DOUBLES),
    "draft_min_confidence": (optional(st.floats(0.0, 0.99)), WILD_DOUBLES),
    "draft_max_entropy": (optional(st.floats(0.0, 20.0)), WILD_DOUBLES),
    "min_tokens": (optional(st.integers(0, 1)), st.integers(0, 2**32 - 1)),
    "repetition_penalty": (optional(st.floats(0.5, 2.0)), WILD_DOUBLES),
    "logit_bias": (st.dictionaries(st.integers(0, 299).map(str), st.floats(-100, 100, width=32),
                                   max_size=3),
                   st.dictionaries(WILD_KEYS, st.floats(width=32), min_size=1, max_size=3)),
    "draft_method": (st.sampled_from(["", *sorted(DRAFT_METHODS)]), WILD_STRINGS),
    "stop": (st.lists(TEXTS, max_size=4), st.lists(st.text(max_size=5), max_size=8)),
    "acceptance": (st.sampled_from(["", "lossless"]), WILD_STRINGS),
    "cascade_rule": (st.sampled_from(["", *CASCADE_RULE_NAMES]), WILD_STRINGS),
    "draft_schedule": (st.sampled_from(["", "auto", "fixed"]), WILD_STRINGS),
}


@dataclass
class Fuzzed:
    message: gateway_pb2.GenerateRequest
    broken: frozenset[str]


@st.composite
def generate_requests(draw) -> Fuzzed:
    """A GenerateRequest: valid, or with up to two fields given malformed or extreme values."""
    broken = draw(broken_fields(GRPC_FIELDS))
    fields = {name: draw(wild if name in broken else valid)
              for name, (valid, wild) in GRPC_FIELDS.items()}
    fields = {name: value for name, value in fields.items() if value is not None}
    message = gateway_pb2.GenerateRequest(chat=draw(st.booleans()), **fields)
    return Fuzzed(message, frozenset(broken))


def pods_refusal(request: GenerationRequest, vocab_size: int) -> str | None:
    """What a pod would say of the session the orchestrator opens for ``request`` (None: it
    runs it as asked): the pod's own checks, and every number arriving as sent, to the wire's
    float32 precision."""
    try:
        session = verifier_pb2.SessionOpen(
            session_id="fuzz", context_tokens=request.prompt_tokens,
            prompt_len=len(request.prompt_tokens), sampling=sampling_to_pb(request.sampling),
            acceptance=acceptance_to_pb(request.acceptance))
        settings = session_settings(session, ModelLimits(vocab_size, CONTEXT))
        draft_config(draft_settings_to_pb(request.draft), settings.policy)
    except ValueError as exc:
        return str(exc)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty"):
        sent, read = getattr(request.sampling, name), getattr(settings.sampling, name)
        if read != as_float32(sent):
            return f"{name}: sent {sent!r}, the pods read {read!r}"
    return None


class RecordingGenerator:
    """Stands for the orchestrator (the only writer to Redis): records every generation it is
    asked for and commits one round of scripted tokens. A request the pods would refuse or read
    differently fails (AssertionError: a server fault), as the gateway must never pass one."""

    def __init__(self, token_ids: list[int], vocab_size: int = 2**32) -> None:
        self.token_ids, self.vocab_size = token_ids, vocab_size
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GeneratedChunk]:
        self.requests.append(request)
        refusal = pods_refusal(request, self.vocab_size)
        assert refusal is None, f"the gateway passed what the pods refuse: {refusal}"
        yield GeneratedChunk("fuzz", self.token_ids, finish_reason=FinishReason.LENGTH)


class GatewayApi:
    """The gateway's gRPC service (the real servicer and tokenizer) on a background loop, in
    front of ``generator``; ``stub`` calls it."""

    def __init__(self, tokenizer, generator) -> None:
        self.tokenizer, self.generator = tokenizer, generator
        defaults = server_defaults(CONTEXT, tokenizer.eos_token_id,
                                   max_tokens_limit=MAX_TOKENS_LIMIT)
        servicer = GatewayServicer(tokenizer, generator, MODEL, defaults)
        self.background = BackgroundLoop()
        self.service = GrpcService([ServiceBinding(gateway_pb2_grpc.add_GatewayServicer_to_server,
                                                   servicer, SERVICE_NAME)], grace_s=1.0)
        self.background.run(self.service.start())
        self.channel = grpc.insecure_channel(self.service.address)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.background.run(self.service.drain())
        self.background.close()
