"""Checks on what reaches a pod's gRPC port, made on the protobuf message before anything is
allocated or a model runs.

The gateway validates what clients send (``cascade.protocol.request.mapping``), but a drafter's or a
verifier's port can be reached by anything on the network, so each pod checks every field it
reads again, against its own model. Sizes are read from the message before any list or tensor is
built from it. A failure is a ``RequestInvalid`` (a ValueError: INVALID_ARGUMENT through the
error interceptor) whose message starts with the field's path, such as
``proposals[2].probs: ...``.

Bounds, documented once (V: the model's vocabulary, L: its context length in tokens):

| field | bound |
|---|---|
| session_id | 1 to MAX_SESSION_ID_CHARS (128) characters |
| context_tokens | 1 to L - 1 ids, each in [0, V) |
| prompt_len | [1, len(context_tokens)]; prompt_len + sampling.max_new_tokens <= L, and the tokens after the prompt at most max_new_tokens |
| sampling | SamplingParams' ranges (logprobs, prompt_logprobs: [0, 20]); stop_token_ids: at most MAX_STOP_TOKEN_IDS (16) ids in [0, V) |
| sampling.grammar | a known kind; a spec of at most MAX_GRAMMAR_CHARS (65536) characters that compiles (cascade.protocol.grammar) |
| acceptance | a known rule that fits the temperature; alpha in [0, 1] |
| draft (drafter) | DraftConfig's ranges: num_draft_tokens <= MAX_DRAFT_TOKENS (32), ngram_max_n <= MAX_NGRAM_N (16), a known method, one that can serve the acceptance rule |
| verifier_address (drafter) | host:port (port 1-65535), at most 255 characters |
| feature_layers (verifier) | at most (layers + 1) indices in [0, layers] |
| tree_nodes (verifier) | at most MAX_TREE_NODES (64) |
| block tokens (verifier) | at most MAX_DRAFT_TOKENS (32) ids in [0, V); a tree: at most MAX_TREE_NODES (64) |
| block parents (verifier) | none (a chain), or one per token, each in [-1, own index); depth and node count also within what the generation has room for (checked by the session) |
| block assumes.path (verifier) | none (a chain), or num_accepted increasing node indices, each below MAX_TREE_NODES (64) |
| block proposals and decision_proposals (verifier) | none, or one per drafted token: 1 to min(MAX_PROPOSAL_TOKENS, V) distinct ids in [0, V), as many probs, each in [0, 1], summing to at most 1 + PROBABILITY_SUM_SLACK |
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from cascade.protocol.grammar import MAX_GRAMMAR_CHARS, grammar_problem
from cascade.protocol.limits import RequestInvalid
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.limits import (
    MAX_DRAFT_TOKENS,
    MAX_PROPOSAL_TOKENS,
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS_TOKENS,
    MAX_STOP_TOKEN_IDS,
    MAX_TREE_NODES,
)
from cascade.protocol.acceptance import AcceptancePolicy
from cascade.protocol.trees import depths, misplaced_parent, path_problem
from cascade.protocol.wire.convert import (
    acceptance_from_pb,
    draft_settings_from_pb,
    grammar_from_pb,
    sampling_from_pb,
)
from cascade.v1 import common_pb2, verifier_pb2

MAX_SESSION_ID_CHARS = 128
MAX_ADDRESS_CHARS = 255
MAX_SOURCE_CHARS = 32
PROBABILITY_SUM_SLACK = 1e-3
"""A proposal's probabilities may sum to a little more than 1 (float32 renormalisation)."""

ADDRESS_PATTERN = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})")
"""host:port, the host a name, an IPv4 address or a bracketed IPv6 address."""


@dataclass(frozen=True)
class ModelLimits:
    """What a pod's model accepts."""

    vocab_size: int
    """Token ids must be below it."""
    max_length: int
    """The model's context in tokens."""
    num_layers: int = 0
    """Decoder layers: hidden-state indices go from 0 (embeddings) to it."""


@dataclass(frozen=True)
class SessionSettings:
    """A session's settings as a pod received them, checked."""

    sampling: SamplingParams
    policy: AcceptancePolicy


def invalid(field: str, problem: str) -> RequestInvalid:
    """The error for one field: its path, then what is wrong and what is allowed."""
    return RequestInvalid(f"{field}: {problem}", field)


@contextmanager
def field_errors(field: str) -> Iterator[None]:
    """Names ``field`` in a ValueError raised by a conversion (a dataclass's own checks)."""
    try:
        yield
    except RequestInvalid:
        raise
    except ValueError as exc:
        raise invalid(field, str(exc)) from exc


def session_settings(msg: verifier_pb2.SessionOpen, limits: ModelLimits) -> SessionSettings:
    """Checks the fields a SessionOpen and a RunSessionRequest share (session, context, sampling,
    acceptance) and returns the settings they carry."""
    check_session_id(msg.session_id)
    check_context(msg.context_tokens, msg.prompt_len, limits)
    check_token_ids("sampling.stop_token_ids", msg.sampling.stop_token_ids, limits.vocab_size,
                    MAX_STOP_TOKEN_IDS)
    check_token_ids("sampling.bias_token_ids", msg.sampling.bias_token_ids, limits.vocab_size,
                    MAX_LOGIT_BIAS_TOKENS)
    if len(msg.sampling.bias_values) != len(msg.sampling.bias_token_ids):
        raise invalid("sampling.bias_values", "one per bias_token_ids entry")
    if any(not math.isfinite(v) for v in msg.sampling.bias_values):
        raise invalid("sampling.bias_values", "must be finite")
    if len(msg.sampling.bad_words) > MAX_BAD_WORDS:
        raise invalid("sampling.bad_words", f"at most {MAX_BAD_WORDS}")
    for word in msg.sampling.bad_words:
        if not word.token_ids:
            raise invalid("sampling.bad_words", "each needs at least one token id")
        check_token_ids("sampling.bad_words.token_ids", word.token_ids, limits.vocab_size,
                        MAX_BAD_WORD_TOKENS)
    check_grammar(msg.sampling)
    with field_errors("sampling"):
        sampling = sampling_from_pb(msg.sampling)
    check_lengths(len(msg.context_tokens), msg.prompt_len, sampling.max_new_tokens, limits)
    with field_errors("acceptance"):
        policy = acceptance_from_pb(msg.acceptance, sampling)
    return SessionSettings(sampling, policy)


def draft_config(msg: common_pb2.DraftSettings, policy: AcceptancePolicy) -> DraftConfig:
    """The drafter's settings for a session (DraftConfig checks every range), able to serve
    the session's acceptance ``policy``."""
    with field_errors("draft"):
        config = draft_settings_from_pb(msg)
    with field_errors("draft.method"):
        config.check(policy)
    return config


def check_grammar(sampling: common_pb2.Sampling) -> None:
    """A grammar, when there is one, of a known kind that compiles."""
    if not sampling.HasField("grammar"):
        return
    if len(sampling.grammar.spec) > MAX_GRAMMAR_CHARS:
        raise invalid("sampling.grammar.spec", f"at most {MAX_GRAMMAR_CHARS} characters")
    with field_errors("sampling.grammar"):
        problem = grammar_problem(grammar_from_pb(sampling.grammar))
    if problem is not None:
        raise invalid("sampling.grammar", problem)


def check_session_id(session_id: str) -> None:
    if not 1 <= len(session_id) <= MAX_SESSION_ID_CHARS:
        raise invalid("session_id", f"must have 1 to {MAX_SESSION_ID_CHARS} characters, got "
                                    f"{len(session_id)}")


def check_token_ids(field: str, ids: Sequence[int], vocab_size: int, most: int) -> None:
    """At most ``most`` ids, each in [0, vocab_size) (the wire's ids are unsigned)."""
    if len(ids) > most:
        raise invalid(field, f"at most {most} token ids, got {len(ids)}")
    if ids and max(ids) >= vocab_size:
        raise invalid(field, f"token ids must be in [0, {vocab_size}), got {max(ids)}")


def check_context(context: Sequence[int], prompt_len: int, limits: ModelLimits) -> None:
    if not context:
        raise invalid("context_tokens", "must hold the prompt (at least 1 token)")
    check_token_ids("context_tokens", context, limits.vocab_size, limits.max_length - 1)
    if not 1 <= prompt_len <= len(context):
        raise invalid("prompt_len", f"must be in [1, {len(context)}] (the context's length), "
                                    f"got {prompt_len}")


def check_lengths(num_context: int, prompt_len: int, max_new_tokens: int,
                  limits: ModelLimits) -> None:
    """The prompt plus max_new_tokens fit the model, and the context holds no more generated
    tokens than max_new_tokens allows."""
    if prompt_len + max_new_tokens > limits.max_length:
        raise invalid("sampling.max_new_tokens",
                      f"prompt_len ({prompt_len}) plus max_new_tokens ({max_new_tokens}) "
                      f"exceed the model's context ({limits.max_length} tokens)")
    if num_context - prompt_len > max_new_tokens:
        raise invalid("context_tokens", f"{num_context - prompt_len} tokens after the prompt; "
                                        f"max_new_tokens allows {max_new_tokens}")


def check_tree_nodes(tree_nodes: int) -> None:
    if tree_nodes > MAX_TREE_NODES:
        raise invalid("tree_nodes", f"at most {MAX_TREE_NODES}, got {tree_nodes}")


def check_feature_layers(layers: Sequence[int], num_layers: int) -> None:
    """Hidden-state indices of the target: 0 (embeddings) to num_layers."""
    check_token_ids("feature_layers", layers, num_layers + 1, num_layers + 1)


def check_verifier_address(address: str) -> None:
    """``host:port`` (the form the pod registry holds)."""
    match = ADDRESS_PATTERN.fullmatch(address) if len(address) <= MAX_ADDRESS_CHARS else None
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        shown = address if len(address) <= 80 else address[:77] + "..."
        raise invalid("verifier_address", f"must be host:port (at most {MAX_ADDRESS_CHARS} "
                                          f"characters, port 1-65535), got {shown!r}")


MAX_SCOPE_CHARS = 512


def check_scope(scope: str, field: str) -> None:
    """A scope (the speculation memory's, a model name and a key's digest; the prefix
    sharing's, a key's digest) of bounded size."""
    if len(scope) > MAX_SCOPE_CHARS:
        raise invalid(field, f"must be at most {MAX_SCOPE_CHARS} characters, got {len(scope)}")


def check_block(msg: verifier_pb2.DraftBlock, vocab_size: int) -> None:
    """A block's sizes and values, before any tensor is built from it."""
    check_nodes("", msg.tokens, msg.parents, vocab_size)
    widest = min(MAX_PROPOSAL_TOKENS, vocab_size)
    for name in ("proposals", "decision_proposals"):
        rows = getattr(msg, name)
        if rows and len(rows) != len(msg.tokens):
            raise invalid(name, f"one per drafted token or none; got {len(rows)} "
                                f"for {len(msg.tokens)} tokens")
        for row, proposal in enumerate(rows):
            check_proposal(f"{name}[{row}]", proposal, vocab_size, widest)
    check_survival(msg.survival, len(msg.tokens))
    if problem := path_problem(msg.assumes.path, msg.assumes.num_accepted):
        raise invalid("assumes.path", problem)
    if len(msg.source) > MAX_SOURCE_CHARS:
        raise invalid("source", f"must be at most {MAX_SOURCE_CHARS} characters")


def check_survival(survival: Sequence[float], num_tokens: int) -> None:
    """A block's own survival estimates: one per drafted token or none, each in [0, 1]."""
    if survival and len(survival) != num_tokens:
        raise invalid("survival", f"one per drafted token or none; got {len(survival)} for "
                                  f"{num_tokens} tokens")
    if any(not 0.0 <= p <= 1.0 for p in survival):  # NaN fails too
        raise invalid("survival", "each must be a probability in [0, 1]")


def check_nodes(prefix: str, tokens: Sequence[int], parents: Sequence[int],
                vocab_size: int) -> None:
    """A block's drafted ids (a chain's at most MAX_DRAFT_TOKENS, a tree's MAX_TREE_NODES) and,
    for a tree, its parents; fields named ``prefix`` + tokens / parents."""
    check_token_ids(f"{prefix}tokens", tokens, vocab_size,
                    MAX_TREE_NODES if parents else MAX_DRAFT_TOKENS)
    if parents:
        check_parents(parents, len(tokens), f"{prefix}parents")


def check_parents(parents: Sequence[int], num_tokens: int, field: str = "parents") -> None:
    """One parent per token, each listed before its child (so a tree, no cycle)."""
    if len(parents) != num_tokens:
        raise invalid(field, f"one per token or none; got {len(parents)} for {num_tokens} "
                             "tokens")
    i = misplaced_parent(parents)
    if i is not None:
        raise invalid(f"{field}[{i}]", f"must be in [-1, {i}) (a parent comes before its "
                                       f"children; -1: the last committed token), got "
                                       f"{parents[i]}")


def check_shadow(msg: verifier_pb2.ShadowBlock, vocab_size: int, num_committed: int) -> None:
    """A shadow block drafts only where every position is committed already (a tree: down to
    its depth)."""
    check_nodes("shadow.", msg.tokens, msg.parents, vocab_size)
    reach = max(depths(msg.parents)) if msg.parents else len(msg.tokens)
    if msg.base_len + reach > num_committed:
        raise invalid("shadow.base_len", f"{msg.base_len} + {reach} positions reach past "
                                         f"the {num_committed} committed tokens")


def check_proposal(field: str, proposal: verifier_pb2.SparseDistribution, vocab_size: int,
                   widest: int) -> None:
    """A sparse distribution: distinct ids in range, one probability each, in [0, 1], summing
    to at most 1 (plus float32 slack)."""
    ids, probs = proposal.token_ids, proposal.probs
    if not 1 <= len(ids) <= widest:
        raise invalid(f"{field}.token_ids", f"must hold 1 to {widest} token ids, got {len(ids)}")
    check_token_ids(f"{field}.token_ids", ids, vocab_size, widest)
    if len(set(ids)) != len(ids):
        raise invalid(f"{field}.token_ids", "must be distinct")
    if len(probs) != len(ids):
        raise invalid(f"{field}.probs", f"must hold one probability per token id ({len(ids)}), "
                                        f"got {len(probs)}")
    if not all(0.0 <= p <= 1.0 for p in probs):  # NaN fails both comparisons
        raise invalid(f"{field}.probs", "must be finite probabilities in [0, 1]")
    if sum(probs) > 1.0 + PROBABILITY_SUM_SLACK:
        raise invalid(f"{field}.probs", f"must sum to at most 1, got {sum(probs):.6g}")
