"""Hypothesis strategies for the messages a drafter and a verifier receive.

Each example is a valid message with a few of its fields (``broken``, possibly none) replaced by
malformed or extreme values: out-of-vocabulary and 2^32 - 1 ids, empty and oversized lists,
NaN, infinities, negative and denormal floats, unknown enum numbers, malformed addresses. A
message with nothing broken must succeed, so the valid half is checked as strictly as the rest.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from hypothesis import strategies as st

from cascade.protocol.methods import DRAFT_METHODS
from cascade.protocol.wire.validation import ADDRESS_PATTERN
from cascade.v1 import common_pb2, drafter_pb2, verifier_pb2
from models import MAX_POSITIONS, VOCAB_SIZE

U32 = 2**32 - 1
U64 = 2**64 - 1
NUM_RULES = len(common_pb2.AcceptanceRule.values())
VALID_SESSION_ID = "fuzz"
"""Stands for a fresh session id: ``with_fresh_session_id`` gives each request its own, so
examples stay reproducible while no two share a session (and its highest epoch)."""
_session_numbers = itertools.count()

WILD_FLOATS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -0.0, 1e-45, 1e-40, 1e-6, 100.5,
                     3.4e38, 1e300]),
    st.floats(width=32),
)
WILD_COUNTS = st.one_of(st.sampled_from([0, 1, MAX_POSITIONS, MAX_POSITIONS + 1, 2**31, U32]),
                        st.integers(0, U32))
WILD_RULES = st.one_of(st.integers(NUM_RULES, 2**31 - 1), st.integers(-(2**31), -1))


def wild_ids(max_size: int) -> st.SearchStrategy[list[int]]:
    """Token id lists with out-of-vocabulary and extreme ids, empty or longer than allowed."""
    ids = st.one_of(st.integers(0, VOCAB_SIZE - 1), st.integers(VOCAB_SIZE, U32),
                    st.just(U32))
    return st.lists(ids, max_size=max_size)


def valid_ids(min_size: int, max_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=min_size, max_size=max_size)


@dataclass
class Fuzzed:
    """A message and which of its fields were given malformed or extreme values."""

    message: object
    broken: frozenset[str] = field(default_factory=frozenset)


def _pick(draw, broken: set[str], name: str, valid, wild):
    return draw(wild if name in broken else valid)


SESSION_FIELDS = ("session_id", "context_tokens", "prompt_len", "temperature", "top_p", "top_k",
                  "max_new_tokens", "stop_token_ids", "rule", "alpha")


@st.composite
def sampling_and_rule(draw, broken: set[str]) -> tuple[common_pb2.Sampling, common_pb2.Acceptance]:
    """A valid Sampling (temperature 0 or in [0.5, 1.5], max_new_tokens 1-8) and the default
    rule for it, or wild values in the broken fields."""
    greedy = draw(st.booleans())
    temperature = 0.0 if greedy else draw(st.floats(0.5, 1.5))
    sampling = common_pb2.Sampling(
        temperature=_pick(draw, broken, "temperature", st.just(temperature), WILD_FLOATS),
        top_p=_pick(draw, broken, "top_p", st.sampled_from([0.9, 1.0]), WILD_FLOATS),
        top_k=_pick(draw, broken, "top_k", st.integers(0, VOCAB_SIZE + 5), WILD_COUNTS),
        seed=draw(st.integers(0, U64)),
        max_new_tokens=_pick(draw, broken, "max_new_tokens", st.integers(1, 8), WILD_COUNTS),
        stop_token_ids=_pick(draw, broken, "stop_token_ids", valid_ids(0, 2), wild_ids(40)))
    acceptance = common_pb2.Acceptance(
        rule=_pick(draw, broken, "rule", st.just(0), WILD_RULES),
        alpha=_pick(draw, broken, "alpha", st.floats(0.0, 1.0), WILD_FLOATS))
    return sampling, acceptance


@st.composite
def session_fields(draw, max_broken: int = 2) -> tuple[dict, set[str]]:
    """The fields SessionOpen and RunSessionRequest share."""
    broken = draw(st.sets(st.sampled_from(SESSION_FIELDS), max_size=max_broken))
    sampling, acceptance = draw(sampling_and_rule(broken))
    context = _pick(draw, broken, "context_tokens", valid_ids(1, 20),
                    wild_ids(MAX_POSITIONS + 8))
    prompt_len = _pick(draw, broken, "prompt_len", st.just(len(context)), WILD_COUNTS)
    session_id = _pick(draw, broken, "session_id",
                       st.just(VALID_SESSION_ID),
                       st.one_of(st.just(""), st.text(max_size=300)))
    fields = dict(session_id=session_id, epoch=draw(st.integers(0, U64)),
                  context_tokens=context, prompt_len=prompt_len, sampling=sampling,
                  acceptance=acceptance)
    return fields, broken


def with_fresh_session_id(*messages) -> None:
    """Gives the messages of one example a new session id, unless theirs is a broken one."""
    fresh = f"fuzz-{next(_session_numbers)}"
    for message in messages:
        if message.session_id == VALID_SESSION_ID:
            message.session_id = fresh


@st.composite
def session_opens(draw) -> Fuzzed:
    fields, broken = draw(session_fields())
    if draw(st.integers(0, 9)) == 0:
        broken.add("feature_layers")
    layers = _pick(draw, broken, "feature_layers", st.just([]), wild_ids(40))
    return Fuzzed(verifier_pb2.SessionOpen(feature_layers=layers, **fields), frozenset(broken))


BLOCK_FIELDS = ("tokens", "proposals", "stale")


@st.composite
def proposal(draw, token: int) -> verifier_pb2.SparseDistribution:
    """A valid sparse q: the drafted token and a few others, positive weights summing to 1."""
    others = draw(st.sets(st.integers(0, VOCAB_SIZE - 1), max_size=5))
    ids = [token, *sorted(others - {token})]
    weights = draw(st.lists(st.floats(0.05, 1.0), min_size=len(ids), max_size=len(ids)))
    return verifier_pb2.SparseDistribution(token_ids=ids,
                                           probs=[w / sum(weights) for w in weights])


WILD_PROPOSALS = st.lists(st.builds(
    verifier_pb2.SparseDistribution,
    token_ids=st.one_of(wild_ids(12), st.just(list(range(VOCAB_SIZE + 1))), st.just([0] * 5000)),
    probs=st.one_of(st.lists(WILD_FLOATS, max_size=12), st.just([0.5] * 5000)),
), max_size=40)
"""Proposals of the wrong number, too wide, with duplicate or out-of-vocabulary ids and probability
lists of the wrong length, NaN, infinite, negative or summing past 1."""


@st.composite
def blocks_for(draw, opened: verifier_pb2.SessionOpen) -> Fuzzed:
    """A block that extends ``opened``'s context: at most the drafts that can still be
    emitted, with a valid q when the session samples (its rule is the default), or wild."""
    broken = draw(st.sets(st.sampled_from(BLOCK_FIELDS), max_size=2))
    generated = len(opened.context_tokens) - opened.prompt_len
    room = max(0, opened.sampling.max_new_tokens - generated - 1)
    tokens = _pick(draw, broken, "tokens", valid_ids(0, room), wild_ids(60))
    sampled = opened.sampling.temperature > 0
    valid_q = (st.tuples(*(proposal(t) for t in tokens)).map(list) if sampled
               else st.just([]))
    proposals = _pick(draw, broken, "proposals", valid_q, WILD_PROPOSALS)
    base_len = len(opened.context_tokens)
    if "stale" in broken:  # another epoch or length: answered with a stale verdict
        base_len += draw(st.integers(1, 5))
    block = verifier_pb2.DraftBlock(session_id=opened.session_id, epoch=opened.epoch,
                                    round=draw(st.integers(0, U32)), base_len=base_len,
                                    tokens=tokens, proposals=proposals)
    return Fuzzed(block, frozenset(broken))


@st.composite
def verify_streams(draw) -> tuple[Fuzzed, Fuzzed | None]:
    """A SessionOpen and, for an open with nothing broken, one block after it."""
    opened = draw(session_opens())
    if opened.broken:
        return opened, None
    return opened, draw(blocks_for(opened.message))


DRAFT_FIELDS = ("num_draft_tokens", "max_proposal_tokens", "method", "ngram", "min_confidence",
                "max_entropy", "verifier_address")
WILD_ADDRESSES = st.one_of(
    st.sampled_from(["", ":", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:1",
                     "[::1]:1", "unix:/tmp/x", "dns:///127.0.0.1:1", "host:port", "a" * 300 + ":1"]),
    st.text(max_size=40).filter(lambda text: not ADDRESS_PATTERN.fullmatch(text)),
)


@st.composite
def draft_settings(draw, broken: set[str]) -> common_pb2.DraftSettings:
    """Valid drafting settings (k 0-4, a known method, ngram lengths that fit), or wild ones."""
    max_n = draw(st.integers(0, 6))  # 0: the default, 4
    min_n = draw(st.integers(0, max_n) if max_n > 1 else st.integers(max_n, 2 - max_n))  # 0: 2
    wild_n = st.one_of(st.sampled_from([17, 1000, U32]), st.integers(0, U32))
    return common_pb2.DraftSettings(
        num_draft_tokens=_pick(draw, broken, "num_draft_tokens", st.integers(0, 4), WILD_COUNTS),
        max_proposal_tokens=_pick(draw, broken, "max_proposal_tokens", st.integers(1, 100),
                                  WILD_COUNTS),
        method=_pick(draw, broken, "method", st.sampled_from(sorted(DRAFT_METHODS)),
                     st.one_of(st.text(max_size=20), st.just("telepathy"))),
        ngram_max_n=_pick(draw, broken, "ngram", st.just(max_n), wild_n),
        ngram_min_n=_pick(draw, broken, "ngram", st.just(min_n), wild_n),
        min_confidence=_pick(draw, broken, "min_confidence", st.sampled_from([0.0, 0.01]),
                             WILD_FLOATS),
        max_entropy=_pick(draw, broken, "max_entropy", st.sampled_from([0.0, 5.0]),
                          WILD_FLOATS),
        send_proposal=draw(st.booleans()))


@st.composite
def run_session_requests(draw, verifier_address: str) -> Fuzzed:
    """A RunSessionRequest against the real verifier, or one with malformed fields."""
    fields, broken = draw(session_fields(max_broken=1))
    broken |= draw(st.sets(st.sampled_from(DRAFT_FIELDS), max_size=1 if broken else 2))
    settings = draw(draft_settings(broken))
    address = _pick(draw, broken, "verifier_address", st.just(verifier_address),
                    WILD_ADDRESSES)
    message = drafter_pb2.RunSessionRequest(draft=settings, verifier_address=address, **fields)
    return Fuzzed(message, frozenset(broken))
