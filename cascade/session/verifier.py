"""The verifier's side of one session as a state machine: ``on(event) -> actions``, no I/O.

The pump (``verifier_service.servicer``) reads the stream, performs the actions (admission,
verification in the scheduler's next step, replies) and feeds back what they return. Shadow
blocks and draft-ready notes are read beside everything else, in any phase after the open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from cascade.session import actions as act
from cascade.session import events as ev
from cascade.session.drafter import ProtocolError
from cascade.session.wire import ends_generation
from cascade.v1 import verifier_pb2


class VerifierPhase(str, Enum):
    NEW = "new"
    """Nothing read yet: only an open may come."""
    OPENING = "opening"
    """Admitting the open, then answering it (features, the plan)."""
    WAITING = "waiting"
    """Waiting for a block."""
    VERIFYING = "verifying"
    """A block is verified in the next step."""
    ALONE = "alone"
    """Decoding the session alone (the plan asked for no drafted tokens)."""
    CATCHING_UP = "catching up"
    """Decoding it alone while the block asked for is on its way (if other sessions step)."""
    DONE = "done"


FIRST_ONLY = "open: send a SessionOpen message before blocks, shadow blocks or ready notes"


@dataclass
class VerifierSession:
    phase: VerifierPhase = VerifierPhase.NEW
    open: verifier_pb2.SessionOpen | None = None
    next_round: int = 0
    _table: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        phases = VerifierPhase
        deciding = (phases.VERIFYING, phases.ALONE, phases.CATCHING_UP)
        self._table: dict[tuple[VerifierPhase, type], Callable[[object], list]] = {
            (phases.NEW, ev.Open): self._admit,
            (phases.OPENING, ev.Admitted): self._admitted,
            (phases.OPENING, ev.Planned): self._planned,
            (phases.WAITING, ev.Block): self._block,
            (phases.CATCHING_UP, ev.Idle): self._idle,
            **{(phase, ev.Verified): self._verified for phase in deciding},
        }

    def start(self) -> list:
        return [act.Read()]

    def on(self, event) -> list:
        if isinstance(event, ev.Ended):
            self.phase = VerifierPhase.DONE
            return []
        if isinstance(event, (ev.Shadow, ev.Ready)):
            return self._aside(event)
        handler = self._table.get((self.phase, type(event)))
        if handler is None:
            if self.phase is VerifierPhase.NEW:
                self.phase = VerifierPhase.DONE
                return [act.Fail(FIRST_ONLY)]
            raise ProtocolError(f"{type(event).__name__} while the session is {self.phase.value}")
        return handler(event)

    def _aside(self, event: ev.Shadow | ev.Ready) -> list:
        if self.phase is VerifierPhase.NEW:
            return [act.Fail(FIRST_ONLY)]
        return [act.Score(event.msg) if isinstance(event, ev.Shadow) else act.NoteReady(event.msg)]

    def _admit(self, event: ev.Open) -> list:
        self.phase, self.open = VerifierPhase.OPENING, event.msg
        return [act.Admit(event.msg)]

    def _admitted(self, _: ev.Admitted) -> list:
        assert self.open is not None  # opening: the open came
        replies = [act.ReplyFeatures()] if self.open.feature_layers else []
        if self.open.plan_drafts:  # how long the first block should be
            return [*replies, act.Plan()]
        self.phase = VerifierPhase.WAITING
        return [*replies, act.Read()]

    def _planned(self, event: ev.Planned) -> list:
        return [act.Reply(event.msg), *self._next(event.msg)]

    def _block(self, event: ev.Block) -> list:
        self.phase = VerifierPhase.VERIFYING
        return [act.Verify(event.msg)]

    def _verified(self, event: ev.Verified) -> list:
        if event.msg is None:  # dropped: the block it waits for is still to come
            return self._idle(event)
        self.next_round = event.msg.round + 1
        return [act.Reply(event.msg)] * event.new + self._next(event.msg)

    def _next(self, msg: verifier_pb2.Verdict) -> list:
        """After a verdict: decode alone while the plan asks for no drafts, else catch up
        while the block asked for is on its way, else wait for it."""
        if msg.is_stale or ends_generation(msg):
            return self._idle(msg)
        if msg.HasField("next_draft_tokens") and msg.next_draft_tokens == 0:
            self.phase = VerifierPhase.ALONE
            return [act.DecodeAlone(self.next_round)]
        self.phase = VerifierPhase.CATCHING_UP
        return [act.CatchUp(self.next_round)]

    def _idle(self, _) -> list:
        self.phase = VerifierPhase.WAITING
        return [act.Read()]
