"""The conversation's events, typed; each read from or written to its message beside it (the
machines' answers to them: ``cascade.session.actions``).

Verifier -> drafter: every message is a ``Verdict``; ``classify`` names its situation as far as
the message alone tells (stale, caught up, or a verdict). Whether a verdict answers the open,
decides a block or is a round the verifier decoded alone, the drafter's phase tells (the table
in ``cascade.session``). Drafter -> verifier: a ``VerifyRequest`` of one kind each
(``classify_request``). Local events report what an action did (``Drafted``, ``Verified`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from cascade.v1 import common_pb2, verifier_pb2

UNDRAFTED = common_pb2.SPECULATION_UNSPECIFIED
"""The origin of a block drafted with no pre-drafts to look in."""
MISS = common_pb2.SPECULATION_MISS
AHEAD_HIT = common_pb2.SPECULATION_AHEAD_HIT


# -- verifier -> drafter ---------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """A verdict that commits tokens (or, answering the open, only features or a plan)."""

    msg: verifier_pb2.Verdict


@dataclass(frozen=True)
class CaughtUp:
    """A round the verifier decoded alone while the block it asked for was on its way."""

    msg: verifier_pb2.Verdict


@dataclass(frozen=True)
class Stale:
    """The session moved on at the verifier (a newer epoch owns it)."""

    msg: verifier_pb2.Verdict


def classify(msg: verifier_pb2.Verdict) -> Verdict | CaughtUp | Stale:
    if msg.is_stale:
        return Stale(msg)
    return CaughtUp(msg) if msg.catching_up else Verdict(msg)


# -- drafter-local: what an action did ----------------------------------------------------------

@dataclass(frozen=True)
class Drafted:
    """The block a ``Draft`` action made (or found among the pre-drafts), and its origin."""

    block: verifier_pb2.DraftBlock
    origin: int = UNDRAFTED


@dataclass(frozen=True)
class ReadyNoted:
    """An ``OfferReady`` found a draft worth verifying and told the verifier."""


# -- drafter -> verifier ---------------------------------------------------------------------

def block_request(block: verifier_pb2.DraftBlock) -> verifier_pb2.VerifyRequest:
    return verifier_pb2.VerifyRequest(block=block)


def ready_request(epoch: int, num_tokens: int) -> verifier_pb2.VerifyRequest:
    return verifier_pb2.VerifyRequest(ready=verifier_pb2.DraftReady(epoch=epoch,
                                                                    num_tokens=num_tokens))


def shadow_request(epoch: int, base_len: int, tokens, parents=()) -> verifier_pb2.VerifyRequest:
    return verifier_pb2.VerifyRequest(shadow=verifier_pb2.ShadowBlock(
        epoch=epoch, base_len=base_len, tokens=tokens, parents=parents))


# -- drafter -> verifier, as the verifier reads them ----------------------------------------------

@dataclass(frozen=True)
class Open:
    msg: verifier_pb2.SessionOpen


@dataclass(frozen=True)
class Block:
    msg: verifier_pb2.DraftBlock


@dataclass(frozen=True)
class Shadow:
    msg: verifier_pb2.ShadowBlock


@dataclass(frozen=True)
class Ready:
    msg: verifier_pb2.DraftReady


@dataclass(frozen=True)
class Ended:
    """The drafter closed its side of the stream."""


REQUEST_EVENTS: dict[str, type[Open | Block | Shadow | Ready]] = {
    "open": Open, "block": Block, "shadow": Shadow, "ready": Ready}


def classify_request(request: verifier_pb2.VerifyRequest) -> Open | Block | Shadow | Ready:
    kind = request.WhichOneof("kind")
    if kind is None:
        raise ValueError("VerifyRequest: set one of open, block, shadow or ready")
    return REQUEST_EVENTS[kind](getattr(request, kind))


# -- verifier-local: what an action did ---------------------------------------------------------

@dataclass(frozen=True)
class Admitted:
    """The open was checked and the session's memory reserved."""


@dataclass(frozen=True)
class Planned:
    """The plan for the first block (a verdict that commits nothing)."""

    msg: verifier_pb2.Verdict


@dataclass(frozen=True)
class Verified:
    """A round's verdict (``new``: not yet sent; a resent block's or the one the session catches
    up from is not); None: the block was dropped (sent ahead on a wrong guess, or on its way
    when the generation ended)."""

    msg: verifier_pb2.Verdict | None
    new: bool = True


@dataclass(frozen=True)
class Idle:
    """A ``CatchUp`` found no reason to decode the session alone."""
