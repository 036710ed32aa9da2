"""The conversation's events and the drafter's actions, typed; each event read from or written
to its message beside it.

Verifier -> drafter: every message is a ``Verdict``; ``classify`` names its situation as far as
the message alone tells (stale, caught up, or a verdict). Whether a verdict answers the open,
decides a block or is a round the verifier decoded alone, the drafter's phase tells (the table
in ``cascade.session``). Drafter-local events report what an action did (``Drafted``,
``ReadyNoted``).
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


# -- the drafter's actions -----------------------------------------------------------------------

@dataclass(frozen=True)
class Send:
    """Write ``request`` to the verifier."""

    request: verifier_pb2.VerifyRequest


@dataclass(frozen=True)
class Draft:
    """Draft the block of ``round`` after ``context`` (answered by ``Drafted``): from the
    pre-drafts made while ``after``'s block was verified if one fits (None: draft now);
    ``origin``: the block's origin if drafted now."""

    round: int
    context: list[int]
    origin: int = UNDRAFTED
    after: verifier_pb2.Verdict | None = None


@dataclass(frozen=True)
class Receive:
    """Wait for the verifier's next message (answered by its event); pre-draft for ``block``'s
    likeliest outcomes meanwhile (None: do not)."""

    block: verifier_pb2.DraftBlock | None = None


@dataclass(frozen=True)
class Observe:
    """Hand the verdict's target features and plan to the proposer."""

    msg: verifier_pb2.Verdict


@dataclass(frozen=True)
class Judge:
    """Tell the proposer how ``block`` fared (it was sent when the last ``Receive`` began)."""

    msg: verifier_pb2.Verdict
    block: verifier_pb2.DraftBlock


@dataclass(frozen=True)
class Relay:
    """Relay the round of ``msg`` to the gateway: it verified (a prefix of) ``block``, which
    came from ``origin``; ``predrafted``: with the pre-drafts made meanwhile."""

    msg: verifier_pb2.Verdict
    block: verifier_pb2.DraftBlock
    origin: int = UNDRAFTED
    predrafted: bool = False


@dataclass(frozen=True)
class Begin:
    """The first round starts (rounds are timed from here)."""


@dataclass(frozen=True)
class StartAlone:
    """The verifier decodes the session alone from here: shadow drafting may start."""


@dataclass(frozen=True)
class Follow:
    """A round decoded alone was committed: shadow drafting goes on after ``committed``."""

    committed: list[int]


@dataclass(frozen=True)
class OfferReady:
    """Tell the verifier if the proposer has a draft worth verifying (answered by
    ``ReadyNoted`` if it did)."""

    committed: list[int]


@dataclass(frozen=True)
class StopAlone:
    """The verifier asks for drafts again: shadow drafting stops."""


@dataclass(frozen=True)
class Finish:
    """The generation ended: close the writing side."""


@dataclass(frozen=True)
class Fail:
    """End the session with an error (``reason``)."""

    reason: str


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


# -- the verifier's actions ----------------------------------------------------------------------

@dataclass(frozen=True)
class Read:
    """Wait for the drafter's next open or block (answered by its event, or ``Ended``)."""


@dataclass(frozen=True)
class Admit:
    """Check the open and reserve the session's memory (answered by ``Admitted``)."""

    msg: verifier_pb2.SessionOpen


@dataclass(frozen=True)
class ReplyFeatures:
    """Send the context's target features (the open asked for them)."""


@dataclass(frozen=True)
class Plan:
    """Plan the first block's length (answered by ``Planned``)."""


@dataclass(frozen=True)
class Reply:
    """Send ``msg`` to the drafter."""

    msg: verifier_pb2.Verdict


@dataclass(frozen=True)
class Verify:
    """Verify the block in the next step (answered by ``Verified``)."""

    msg: verifier_pb2.DraftBlock


@dataclass(frozen=True)
class DecodeAlone:
    """Decode round ``round`` with no drafted tokens (answered by ``Verified``)."""

    round: int


@dataclass(frozen=True)
class CatchUp:
    """Decode round ``round`` alone while the block asked for is on its way, if other sessions
    keep the verifier stepping and no request waits (answered by ``Verified``, else ``Idle``)."""

    round: int


@dataclass(frozen=True)
class Score:
    """Score a shadow block against the committed tokens."""

    msg: verifier_pb2.ShadowBlock


@dataclass(frozen=True)
class NoteReady:
    """The drafter has a draft ready: the plan's next verdict asks for it."""

    msg: verifier_pb2.DraftReady
