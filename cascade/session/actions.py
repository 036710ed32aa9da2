"""What the two machines ask their pumps to do (``DrafterSession.on`` and ``VerifierSession.on``
return lists of these); an action that has an answer is answered by an event
(``cascade.session.events``)."""

from __future__ import annotations

from dataclasses import dataclass

from cascade.session.events import UNDRAFTED
from cascade.v1 import verifier_pb2


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
