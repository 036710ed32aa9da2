"""The fields of a generation request, as either API states them, validated once.

Both front ends hand their fields to ``GenerationOptions`` (the HTTP request models extend it;
the gRPC servicer validates a dict of the fields its request has set with ``validate_options``),
so the same bad request gets the same message (HTTP 400 / gRPC INVALID_ARGUMENT) whichever way it
came; ``describe_validation_error`` words pydantic's errors as OpenAI does.

Defaults, documented once (OpenAI's where OpenAI has the field):

| field | default | range |
|---|---|---|
| temperature | 1.0 | [0, 2]; 0 is greedy, and so is anything below 1e-5 |
| top_p | 1.0 | (0, 1] |
| top_k | 0 (all tokens) | [0, 2^31 - 1] |
| seed | random | any integer (taken mod 2^64) |
| logit_bias | {} | up to 300 token ids (as strings) -> a bias in [-100, 100] added to the target's logits |
| presence_penalty, frequency_penalty | 0 | [-2, 2]: subtracted from the logit of every token generated before the position (once, or per occurrence); drafted tokens before it count |
| repetition_penalty | 1 | (0, 10]: the logits of tokens in the prompt or generated before the position are divided (positive) or multiplied (negative) by it |
| bad_words | [] | up to 32 strings of at most 256 characters (vLLM): never generated, as tokenized alone and after a space |
| min_tokens | 0 | [0, max_tokens (or what the request may generate)]: no stop token (end of sequence, stop_token_ids) is chosen before this many tokens |
| stop_token_ids | [] | up to 15 token ids of the vocabulary; generation also ends after any of them (kept in the output) |
| max_tokens | completions: 16; chat and gRPC: as many as fit, up to the server limit | [1, limit]; completions with echo: [0, limit] (gateway.openai.echo) |
| stop | none | up to 4 strings (OpenAI's limit) of at most 512 characters |
| num_draft_tokens | the server's default k (4) | [0, 32]; 0 decodes on the target alone |
| draft_method | the server's default (`--draft-method`, "auto": each round from whichever source pays most, cascade.core.proposers.auto; requests that need the drafter model's q — a speculative cascade, the recursive rule, the adaptive schedule — get "model") | cascade.protocol.methods.DRAFT_METHODS |
| acceptance | "lossless" | "lossless" (speculative sampling; the keyed rule when the request gives a seed or drafts trees), "keyed" (lossless, and a seeded sampled request's text depends on its prompt and seed alone, whatever was drafted), "recursive" (lossless; sampled trees whose children are drafted from q and tried in turn, SpecInfer) or "cascade" (a speculative cascade: faster, lossy) |
| cascade_rule | "chow" | chow, diff, opt, token_v1, token_v2, token_v3 (with "cascade") |
| cascade_alpha | 0.0 | [0, 1]; larger trades quality for speed (with "cascade") |
| draft_schedule | "auto" | "auto" (the verifier drafts only what pays at its load: each round's length in [0, k], cascade.core.plan.goodput; a speculative cascade is verified as "fixed"), "fixed" (always k) or "adaptive" (k moves in [1, 2k] with the drafter's success; draft_method "model") |
| draft_min_confidence | 0.0 (off) | [0, 1): a block stops where the drafter's top probability is below it |
| draft_max_entropy | 0.0 (off) | [0, 20] nats: a block stops where the drafter's entropy is above it |
| draft_tree_nodes | the server's default (0: chains) | [0, 64]: each round drafts a token tree of at most this many nodes, at most k deep (not with "cascade" or "adaptive"; prompt lookup makes every earlier match a branch); sampled trees are verified with the keyed rule; under "auto" the verifier takes the best-first prefix of each tree's nodes that pays (down to none) |
| draft_tree_branching | 4 | [1, 16]: children a tree node offers and nodes kept per depth (the first position offers 4x as many) |
| draft_tree_expansion | "dynamic" | "dynamic" (EAGLE-2: each depth's best nodes are expanded) or "confidence" (CAPE: the drafter's chain plus 1, 3, 5 or 7 runners-up at each position as its top probability is above 0.8, 0.6, 0.3 or not; drafted at a chain's cost; not with "recursive") |

Every number field's range holds for the value as the pods receive it too: the wire carries
them as float32, so a value that rounds out of its range there (1e-50 as top_p rounds to 0) is
refused naming the field.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cascade.protocol.limits import RequestInvalid, shortened
from cascade.protocol.methods import DRAFT_METHODS
from cascade.protocol.request.prediction import Prediction
from cascade.protocol.settings import MIN_TEMPERATURE, as_float32, DraftConfig
from cascade.protocol.limits import (
    MAX_DRAFT_TOKENS,
    MAX_ENTROPY,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_TOKENS,
    MAX_STOP_TOKEN_IDS,
    MAX_TREE_BRANCHING,
    MAX_TREE_NODES,
    TREE_EXPANSIONS,
)

CASCADE_RULE_NAMES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 512
"""Longest stop string: stop strings are stored with each choice's session in Redis (a stream
resumed elsewhere stops at the same text), so they are bounded like the rest of a request."""
MAX_BAD_WORD_CHARS = 256
"""Longest bad word, checked before it is tokenized (a word must come to at most
MAX_BAD_WORD_TOKENS tokens anyway; tokenizing a 1 MB one first would hold up the gateway)."""
MAX_TOP_K = 2**31 - 1
BOUND_CHECKS = {"gt": (">", operator.gt), "ge": (">=", operator.ge), "lt": ("<", operator.lt),
                "le": ("<=", operator.le)}
"""A number field's bounds (pydantic's constraint names): how its value must compare."""


class Lenient(BaseModel):
    """Ignores unknown fields and treats an explicit null like an absent field (as OpenAI does),
    but coerces no value across types: ``"stream": "yes"``, ``"max_tokens": "16"`` or
    ``"n": 1.0`` is a 400 naming the field, as OpenAI answers (an integer where a number is
    expected is a number)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


def valid_text(value: str) -> str:
    """``value`` if it is valid Unicode text (JSON can carry lone surrogates such as \\ud800,
    which no tokenizer accepts)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it contains a lone surrogate)") from None
    return value


def _bounded_text(value: str, limit: int, what: str) -> str:
    """``value`` if it is valid text of at most ``limit`` characters."""
    if len(value) > limit:
        raise ValueError(f"{what} may be at most {limit} characters, got one of {len(value)}")
    return valid_text(value)


class GenerationOptions(Lenient):
    """How to generate, as either API states it (the table above)."""

    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=MAX_TOP_K)
    """Cascade extension: keep only the k most likely tokens; 0 keeps all."""
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, max_length=MAX_STOP_TOKEN_IDS - 1)
    """vLLM extension: generation also ends after any of these token ids (kept in the output),
    besides the model's end-of-sequence token."""
    logit_bias: dict[str, float] = Field(default_factory=dict,
                                         max_length=MAX_LOGIT_BIAS_TOKENS)
    """Token id (as a string, as OpenAI sends it) -> bias in [-100, 100], added to the target's
    logits before sampling."""
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    """vLLM extension (prompt and generated tokens; 1 is none)."""
    bad_words: list[str] = Field(default_factory=list, max_length=MAX_BAD_WORDS // 2)
    """vLLM extension: words never generated (as tokenized alone and after a space)."""
    min_tokens: int = Field(0, ge=0)
    """vLLM extension: no stop token (end of sequence, stop_token_ids) before this many
    generated tokens."""
    num_draft_tokens: int | None = Field(None, ge=0, le=MAX_DRAFT_TOKENS)
    """Cascade extension (OpenAI clients send it via extra_body): drafted tokens per round."""
    draft_method: str | None = None
    """Cascade extension: a name in cascade.protocol.methods.DRAFT_METHODS (None: the
    server's default where the request can use it, else model)."""
    acceptance: Literal["lossless", "keyed", "recursive", "cascade"] = "lossless"
    """Cascade extension: lossless speculative decoding (keyed: with the text a function of the
    prompt and seed alone), or a speculative cascade."""
    cascade_rule: Literal[CASCADE_RULE_NAMES] = "chow"  # type: ignore[valid-type]
    """Cascade extension: the deferral rule of a speculative cascade."""
    cascade_alpha: float = Field(0.0, ge=0.0, le=1.0)
    """Cascade extension: the cascade's quality knob (0 keeps the most quality)."""
    draft_schedule: Literal["auto", "fixed", "adaptive"] = "auto"
    """Cascade extension: a fixed k, or k adapted to the drafter's recent success."""
    draft_min_confidence: float = Field(0.0, ge=0.0, lt=1.0)
    """Cascade extension: end a block where the drafter's top probability is below this."""
    draft_max_entropy: float = Field(0.0, ge=0.0, le=MAX_ENTROPY)
    """Cascade extension: end a block where the drafter's entropy (nats) is above this."""
    draft_tree_nodes: int | None = Field(None, ge=0, le=MAX_TREE_NODES)
    """Cascade extension: draft token trees of at most this many nodes (0: chains)."""
    draft_tree_branching: int = Field(DraftConfig.tree_branching, ge=1, le=MAX_TREE_BRANCHING)
    """Cascade extension: children a tree node offers (nodes kept per depth)."""
    draft_tree_expansion: Literal[TREE_EXPANSIONS] = "dynamic"  # type: ignore[valid-type]
    """Cascade extension: how the drafter grows trees (EAGLE-2's dynamic or CAPE's
    confidence-aware expansion)."""
    prediction: Prediction | None = None
    """OpenAI's Predicted Outputs: text the client expects back, drafted from
    (cascade.protocol.request.prediction)."""

    @field_validator("temperature")
    @classmethod
    def _tiny_is_greedy(cls, value: float) -> float:
        """Below MIN_TEMPERATURE sampling is numerically greedy anyway (and NaN in float32)."""
        return 0.0 if value < MIN_TEMPERATURE else value

    @field_validator("*")
    @classmethod
    def _in_range_as_float32(cls, value: Any, info: ValidationInfo) -> Any:
        """A number keeps its field's range once rounded to the wire's float32."""
        if type(value) is not float or info.field_name is None:
            return value
        wire = as_float32(value)
        for constraint in cls.model_fields[info.field_name].metadata:
            for name, (symbol, holds) in BOUND_CHECKS.items():
                bound = getattr(constraint, name, None)
                if bound is not None and not holds(wire, bound):
                    raise ValueError(f"{value!r} rounds to {wire!r} at float32 (the precision "
                                     f"the pods receive), and must be {symbol} {bound:g} there "
                                     "too")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or len(value) > MAX_STOP_STRINGS or not all(
                isinstance(item, str) for item in value):
            raise ValueError(f"must be a string or a list of up to {MAX_STOP_STRINGS} strings")
        return [_bounded_text(item, MAX_STOP_CHARS, "a stop string") for item in value]

    @field_validator("bad_words")
    @classmethod
    def _short_bad_words(cls, value: list[str]) -> list[str]:
        return [_bounded_text(word, MAX_BAD_WORD_CHARS, "a bad word") for word in value]

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, value: dict[str, float]) -> dict[str, float]:
        for key, bias in value.items():
            if not (key.isascii() and key.isdigit()):  # not '²' or '١' (int() refuses them)
                raise ValueError(f"keys must be token ids (non-negative integers), got {shortened(key)!r}")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"biases must be in [-{MAX_LOGIT_BIAS:g}, "
                                 f"{MAX_LOGIT_BIAS:g}], got {bias}")
        return value

    @field_validator("draft_method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value not in DRAFT_METHODS:
            raise ValueError(f"must be one of {', '.join(sorted(DRAFT_METHODS))}, got "
                             f"{shortened(value)!r}")
        return value


def validate_options(fields: dict[str, Any]) -> GenerationOptions:
    """``GenerationOptions`` from plain fields; RequestInvalid names the first bad one."""
    try:
        return GenerationOptions.model_validate(fields)
    except ValidationError as exc:
        message, param = describe_validation_error(exc.errors())
        raise RequestInvalid(message, param or "request") from exc


REQUEST_PARTS = ("body", "query", "path", "header", "cookie")
"""The first element of a FastAPI validation error's location."""


def describe_validation_error(errors: Sequence[Any]) -> tuple[str, str | None]:
    """The message and param for pydantic's first error, naming the field and what is allowed."""
    if not errors:
        return "Invalid request.", None
    err = errors[0]
    loc = list(err.get("loc", ()))
    if loc and loc[0] in REQUEST_PARTS:  # where the field was sent, not part of its name
        loc = loc[1:]
    param = _param_name(loc)
    kind = err.get("type", "")
    if kind == "json_invalid":
        detail = err.get("ctx", {}).get("error", "")
        return f"The request body is not valid JSON ({detail}).", None
    if param is None:
        if kind == "missing":
            return "The request body is missing; send a JSON object.", None
        return "The request body must be a JSON object (Content-Type: application/json).", None
    if kind == "missing":
        return f"Missing required parameter: '{param}'.", param
    if kind == "value_error" and "error" in err.get("ctx", {}):
        return f"Invalid value for '{param}': {err['ctx']['error']}.", param
    got = repr(err.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    return f"Invalid value for '{param}': {err.get('msg', 'invalid')} (got {got}).", param


def _param_name(loc: Sequence[Any]) -> str | None:
    """("messages", 0, "content") -> "messages[0].content"."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name or None
