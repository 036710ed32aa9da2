"""The one mapping from an API request (HTTP or gRPC) to a generation's settings.

Both front ends hand their fields to ``GenerationOptions`` (the HTTP request models extend it;
the gRPC servicer validates a dict of the fields its request has set), then call
``build_request``. So the same request gets the same settings, and the same bad request the same
message, whichever way it came (HTTP 400 / gRPC INVALID_ARGUMENT). The fields, their defaults
and their bounds: ``cascade.protocol.request.options``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cascade.protocol.limits import RequestInvalid, fit_lengths, shortened
from cascade.protocol.methods import DRAFT_METHODS, MODEL_METHOD
from cascade.protocol.request.options import GenerationOptions
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.limits import MAX_DRAFT_TOKENS, MAX_BAD_WORD_TOKENS, MAX_TREE_NODES
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule


@dataclass(frozen=True)
class ServerDefaults:
    """What the mapping needs to know about the served model and the server's limits. The
    values come from the gateway's flags (``gateway.settings.HttpSettings.server_defaults``),
    where each is declared once with its default; this type only carries and checks them."""

    context_length: int
    """The target's context in tokens; prompt plus max_tokens must fit in it."""
    max_tokens_limit: int
    """Largest max_tokens a request may ask for (and the default where none is given)."""
    default_num_draft_tokens: int
    """Drafted tokens per round when a request does not say."""
    eos_token_id: int | None
    """Ends every generation (the stop token of the model)."""
    default_tree_nodes: int
    """Token-tree nodes per round when a request does not say (0: chains); requests that
    cannot draft trees (another method, a cascade, the adaptive schedule) get chains."""
    default_draft_method: str
    """The drafting method of requests that do not name one (and can use it)."""

    def __post_init__(self) -> None:
        if self.context_length < 2:
            raise ValueError(f"context_length must be at least 2, got {self.context_length}")
        if self.max_tokens_limit < 1:
            raise ValueError(f"max_tokens_limit must be at least 1, got {self.max_tokens_limit}")
        if not 0 <= self.default_num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"default_num_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], "
                             f"got {self.default_num_draft_tokens}")
        if not 0 <= self.default_tree_nodes <= MAX_TREE_NODES:
            raise ValueError(f"default_tree_nodes must be in [0, {MAX_TREE_NODES}], "
                             f"got {self.default_tree_nodes}")
        if self.default_draft_method not in DRAFT_METHODS:
            raise ValueError(f"default_draft_method must be one of "
                             f"{', '.join(sorted(DRAFT_METHODS))}, got "
                             f"{self.default_draft_method!r}")


@dataclass(frozen=True)
class GenerationRequest:
    """One generation, fully specified: what the gateway stores and runs."""

    prompt_tokens: list[int]
    sampling: SamplingParams
    draft: DraftConfig = field(default_factory=DraftConfig)
    acceptance: AcceptancePolicy = None  # type: ignore[assignment]  # set by __post_init__
    """Given None (the default): the default for the sampling and draft settings."""
    view: str = ""
    """How the API layer presents the stream (JSON, opaque here): stored with the session, so
    a stream resumed on another gateway looks the same."""
    caller: str = ""
    """Digest of the API key that started the generation (gateway.auth): stored with the
    session, and only that key may resume it. Empty or "anonymous" where keys are off."""
    group: str = ""
    """The request this generation is one choice of (n, best_of, a list of prompts): its
    choices of one prompt go to the same pods, which compute the prompt once
    (``gateway.sessions.affinity``). Empty: a request of one choice. Not stored."""

    def __post_init__(self) -> None:
        if self.acceptance is None:
            policy = AcceptancePolicy.default_for(self.sampling, self.draft)
            object.__setattr__(self, "acceptance", policy)

    @property
    def num_draft_tokens(self) -> int:
        """Drafted tokens per round; 0 decodes on the verifier alone."""
        return self.draft.num_draft_tokens


def check_vocabulary(options: GenerationOptions, vocab_size: int) -> None:
    """The request's token ids exist in the served model's vocabulary."""
    for name, ids in (("stop_token_ids", options.stop_token_ids),
                      ("logit_bias", [int(t) for t in options.logit_bias])):
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            raise RequestInvalid(f"Invalid value for '{name}': token id {bad} is outside the "
                                 f"vocabulary [0, {vocab_size}).", name)


def with_bad_words(request: GenerationRequest, options: GenerationOptions,
                   tokenize: Callable[[str], list[int]]) -> GenerationRequest:
    """The request with its bad words as token sequences (each word alone and after a space,
    as vLLM bans them); RequestInvalid names a word that tokenizes too long."""
    if not options.bad_words:
        return request
    sequences: dict[tuple[int, ...], None] = {}
    for word in options.bad_words:
        for text in (word, " " + word):
            ids = tuple(tokenize(text))
            if len(ids) > MAX_BAD_WORD_TOKENS:
                raise RequestInvalid(f"Invalid value for 'bad_words': {shortened(word)!r} is "
                                     f"longer than {MAX_BAD_WORD_TOKENS} tokens.", "bad_words")
            if ids:
                sequences[ids] = None
    return replace(request, sampling=replace(request.sampling, bad_words=tuple(sequences)))


def build_request(options: GenerationOptions, prompt_tokens: list[int], max_tokens: int | None,
                  server: ServerDefaults, prompt_field: str = "prompt",
                  max_field: str = "max_tokens") -> GenerationRequest:
    """The settings of one generation; RequestInvalid when the prompt or completion can't fit
    (naming ``prompt_field`` or ``max_field``, the fields the client sent them in)."""
    max_new_tokens = fit_lengths(len(prompt_tokens), max_tokens, server.context_length,
                                 server.max_tokens_limit, prompt_field, max_field)
    if options.min_tokens > max_new_tokens:  # it could never finish
        raise RequestInvalid(f"Invalid value for 'min_tokens': must be at most the {max_new_tokens}"
                             f" tokens the completion may have ('{max_field}'), got "
                             f"{options.min_tokens}.", "min_tokens")
    sampling = SamplingParams(
        temperature=options.temperature, top_k=options.top_k, top_p=options.top_p,
        seed=secrets.randbits(63) if options.seed is None else options.seed % 2**64,
        max_new_tokens=max_new_tokens, min_tokens=options.min_tokens,
        logit_bias=tuple(sorted((int(t), float(b)) for t, b in options.logit_bias.items())),
        presence_penalty=options.presence_penalty, frequency_penalty=options.frequency_penalty,
        repetition_penalty=options.repetition_penalty,
        stop_token_ids=tuple(dict.fromkeys(
            ([] if server.eos_token_id is None else [server.eos_token_id])
            + options.stop_token_ids)))
    draft = _draft_config(options, server)
    policy = _lossless_policy(options, sampling, draft)
    if options.acceptance == "cascade":
        policy = AcceptancePolicy(AcceptanceRule(options.cascade_rule), options.cascade_alpha)
    if policy is not None:
        try:
            draft.check(policy)
        except ValueError as exc:
            name = ("draft_tree_expansion" if str(exc).startswith("tree_expansion")
                    else "acceptance")
            raise RequestInvalid(f"Invalid value for '{name}': {exc}.", name) from exc
    return GenerationRequest(list(prompt_tokens), sampling, draft,
                             policy or AcceptancePolicy.default_for(sampling, draft))


def _lossless_policy(options: GenerationOptions, sampling: SamplingParams,
                     draft: DraftConfig) -> AcceptancePolicy | None:
    """The keyed or recursive rule where asked for; the keyed one where a sampled request
    gives a seed (its text then depends on its prompt, parameters and seed alone, whatever the
    load makes the drafts) or drafts trees without naming a rule; None: the default for the
    settings (speculative sampling)."""
    plain = options.acceptance == "lossless" and not draft.tree_nodes and options.seed is None
    if options.acceptance == "cascade" or plain:
        return None
    if sampling.is_greedy:
        return AcceptancePolicy(AcceptanceRule.GREEDY)
    recursive = options.acceptance == "recursive"
    return AcceptancePolicy(AcceptanceRule.RECURSIVE if recursive else AcceptanceRule.KEYED)


def _draft_method(options: GenerationOptions, server: ServerDefaults) -> str:
    """The request's method; else the server's default, unless the request needs the drafter
    model's q (a speculative cascade, the recursive rule, the adaptive schedule)."""
    if options.draft_method is not None:
        return options.draft_method
    needs_model = (options.acceptance in ("cascade", "recursive")
                   or options.draft_schedule == "adaptive")
    return MODEL_METHOD if needs_model else server.default_draft_method


def _draft_config(options: GenerationOptions, server: ServerDefaults) -> DraftConfig:
    adaptive = options.draft_schedule == "adaptive"
    method = _draft_method(options, server)
    if adaptive and method != MODEL_METHOD:
        raise RequestInvalid("Invalid value for 'draft_schedule': the adaptive schedule follows "
                             f"the drafter model, so it needs draft_method "
                             f"'{MODEL_METHOD}'.", "draft_schedule")
    k = options.num_draft_tokens
    k = server.default_num_draft_tokens if k is None else k
    tree_nodes = _tree_nodes(options, server) if k else 0
    return DraftConfig(k, min_confidence=options.draft_min_confidence,
                       max_entropy=options.draft_max_entropy, adaptive=adaptive,
                       planned=_is_planned(options),
                       method=method, tree_nodes=tree_nodes,
                       tree_branching=options.draft_tree_branching,
                       tree_expansion=options.draft_tree_expansion)


def _tree_nodes(options: GenerationOptions, server: ServerDefaults) -> int:
    """The request's tree size; the server's default where it says nothing and can draft
    trees. A request that asks for a tree it cannot draft is refused, naming the field."""
    cannot = None
    if options.acceptance == "cascade":
        cannot = "a speculative cascade verifies chains only"
    elif options.draft_schedule == "adaptive":
        cannot = "the adaptive schedule drafts chains"
    if options.draft_tree_nodes is None:
        return 0 if cannot else server.default_tree_nodes
    if options.draft_tree_nodes and cannot:
        raise RequestInvalid(f"Invalid value for 'draft_tree_nodes': {cannot}; send 0 or leave "
                             "it out.", "draft_tree_nodes")
    return options.draft_tree_nodes


def _is_planned(options: GenerationOptions) -> bool:
    """"auto" plans lossless sessions only: a speculative cascade's output depends on which
    positions were drafted, so it verifies every drafted token (as "fixed")."""
    return options.draft_schedule == "auto" and options.acceptance != "cascade"
