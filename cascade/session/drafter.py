"""The drafter's side of one session as a state machine: ``on(event) -> actions``, no I/O.

The pump (``drafter_service.draft_loop``) performs the actions (drafting on the model thread,
writing to the stream, relaying rounds) and feeds back what they and the verifier answer. The
phases and what moves between them are the table in ``cascade.session``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from cascade.session import actions as act
from cascade.session import events as ev
from cascade.session.wire import ends_generation, tokens_after
from cascade.v1 import verifier_pb2

EMPTY_BLOCK = verifier_pb2.DraftBlock()
"""The block of a round the verifier decoded alone."""


class Phase(str, Enum):
    OPENING = "opening"
    """Reading the replies to the open: target features, then the plan for the first block."""
    DRAFTING = "drafting"
    """A block is being drafted (or looked up among the pre-drafts)."""
    VERIFYING = "verifying"
    """The block is with the verifier (pre-drafting for its outcomes meanwhile)."""
    ALONE = "alone"
    """The verifier decodes the session alone (the plan asked for no drafted tokens)."""
    DONE = "done"


class ProtocolError(RuntimeError):
    """An event the session's phase does not expect."""


@dataclass
class DrafterSession:
    open: verifier_pb2.VerifyRequest
    """The session's open message (sent first)."""
    committed: list[int]
    """The committed tokens (the context at first)."""
    open_replies: int = 0
    """Replies with target features the open asks for (a feature drafter)."""
    planned: bool = False
    """Whether a plan for the first block follows them (a planned session)."""
    speculates: bool = False
    """Whether to pre-draft while a block is verified."""
    phase: Phase = Phase.OPENING
    planned_length: int | None = None
    """The verifier's plan for the next block's length (None: the drafter's own k)."""
    block: verifier_pb2.DraftBlock | None = None
    """The block with the verifier."""
    origin: int = ev.UNDRAFTED
    predrafted: bool = False
    """Whether pre-drafts were made while ``block`` was verified (reset by rounds decoded
    alone meanwhile: they were made for another base)."""
    caught_up: bool = False
    """Whether rounds were decoded alone while ``block`` was on its way."""
    next_round: int = 0
    noted: bool = False
    """Whether a draft-ready note went out while the verifier decodes alone."""
    _table: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._table: dict[tuple[Phase, type], Callable[[object], list]] = {
            (Phase.OPENING, ev.Verdict): self._open_reply,
            (Phase.ALONE, ev.Verdict): self._alone_round,
            (Phase.DRAFTING, ev.Drafted): self._drafted,
            (Phase.VERIFYING, ev.CaughtUp): self._caught_up_round,
            (Phase.VERIFYING, ev.Verdict): self._verdict,
        }

    def start(self) -> list:
        """The first actions: send the open, then wait for its replies or draft."""
        return [act.Send(self.open), *self._replies_or_rounds()]

    def on(self, event) -> list:
        if isinstance(event, ev.Stale):
            self.phase = Phase.DONE
            return [act.Fail("the session moved on at the verifier (a newer epoch)")]
        if isinstance(event, ev.ReadyNoted):
            self.noted = True
            return []
        handler = self._table.get((self.phase, type(event)))
        if handler is None:
            raise ProtocolError(f"{type(event).__name__} while the session is {self.phase.value}")
        return handler(event)

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    # -- opening ---------------------------------------------------------------------------

    def _replies_or_rounds(self) -> list:
        if self.open_replies or self.planned:
            return [act.Receive()]
        return [act.Begin(), *self._draft(ev.MISS if self.speculates else ev.UNDRAFTED)]

    def _open_reply(self, event: ev.Verdict) -> list:
        actions = self._observe(event.msg)
        if self.open_replies:
            self.open_replies -= 1
        else:
            self.planned = False  # the plan came
        if self.open_replies or self.planned:
            return [*actions, act.Receive()]
        actions.append(act.Begin())
        if self.planned_length == 0:  # the verifier decodes it alone from the start
            return [*actions, *self._enter_alone()]
        return [*actions, *self._draft(ev.MISS if self.speculates else ev.UNDRAFTED)]

    # -- blocks ----------------------------------------------------------------------------

    def _draft(self, origin: int, after: verifier_pb2.Verdict | None = None) -> list:
        self.phase = Phase.DRAFTING
        return [act.Draft(self.next_round, list(self.committed), origin, after)]

    def _drafted(self, event: ev.Drafted) -> list:
        self.phase, self.block, self.origin = Phase.VERIFYING, event.block, event.origin
        self.caught_up = False
        self.predrafted = self.speculates and self.planned_length != 0
        sent = [] if event.origin == ev.AHEAD_HIT else [act.Send(ev.block_request(event.block))]
        return [*sent, act.Receive(event.block if self.predrafted else None)]

    def _caught_up_round(self, event: ev.CaughtUp) -> list:
        """A round decoded alone while the block is on its way: relayed; the block still
        comes (and is verified from where such rounds leave it)."""
        self.committed.extend(event.msg.tokens)
        self.caught_up, self.predrafted = True, False
        self.next_round = event.msg.round + 1
        actions = [act.Relay(event.msg, EMPTY_BLOCK)]
        return [*actions, *self._end()] if ends_generation(event.msg) else [*actions,
                                                                            act.Receive()]

    def _verdict(self, event: ev.Verdict) -> list:
        msg, block = event.msg, self.block
        assert block is not None  # verifying: a block is out
        actions = self._observe(msg)
        if self.caught_up:  # the verifier took the block from where those rounds left it
            block = verifier_pb2.DraftBlock(
                tokens=tokens_after(block, self.committed[block.base_len:]),
                draft_us=block.draft_us, source=block.source)
        self.committed.extend(msg.tokens)
        self.next_round = msg.round + 1
        actions += [act.Judge(msg, block), act.Relay(msg, block, self.origin, self.predrafted)]
        if ends_generation(msg):
            return [*actions, *self._end()]
        if self.planned_length == 0:
            return [*actions, *self._enter_alone()]
        return [*actions, *self._draft(ev.UNDRAFTED, msg if self.predrafted else None)]

    # -- decoded alone ---------------------------------------------------------------------

    def _enter_alone(self) -> list:
        self.phase, self.noted = Phase.ALONE, False
        return [act.StartAlone(), act.Receive()]

    def _alone_round(self, event: ev.Verdict) -> list:
        msg = event.msg
        actions = self._observe(msg)
        self.committed.extend(msg.tokens)
        self.next_round = msg.round + 1
        actions += [act.Relay(msg, EMPTY_BLOCK), act.Follow(list(self.committed))]
        if ends_generation(msg):
            return [*actions, act.StopAlone(), *self._end()]
        if self.planned_length != 0:  # drafts pay again
            return [*actions, act.StopAlone(), *self._draft(ev.UNDRAFTED)]
        if not self.noted:
            actions.append(act.OfferReady(list(self.committed)))
        return [*actions, act.Receive()]

    # -- common ----------------------------------------------------------------------------

    def _observe(self, msg: verifier_pb2.Verdict) -> list:
        if msg.HasField("next_draft_tokens"):
            self.planned_length = msg.next_draft_tokens
        return [act.Observe(msg)] if msg.HasField("features") or msg.HasField(
            "next_draft_tokens") else []

    def _end(self) -> list:
        self.phase = Phase.DONE
        return [act.Finish()]
