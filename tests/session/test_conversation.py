"""The two machines against each other in-process: a drafter whose drafts go wrong now and then,
a verifier whose "target" is a fixed token sequence and whose plan sends the session to decode
alone and back. Whatever the plan, the relayed rounds commit exactly the target's tokens."""

from collections import deque

import pytest

from cascade.session import actions as act
from cascade.session import events as ev
from cascade.session.drafter import DrafterSession
from cascade.session.verifier import VerifierSession
from cascade.session.wire import tokens_after
from cascade.v1 import common_pb2, verifier_pb2

CONTEXT = [1, 2, 3]
TRUTH = [100 + i for i in range(40)]
K = 4


class Target:
    """The verifier's model: greedy continuation is ``TRUTH``; ``plan(round)``: the drafted
    tokens it asks for next; ``catch_up``: rounds to decode alone after each verdict asking for
    a block."""

    def __init__(self, plan, catch_up=0):
        self.committed, self.plan, self.catch_up = list(CONTEXT), plan, catch_up
        self.owed = 0

    def _next(self) -> int:
        return TRUTH[len(self.committed) - len(CONTEXT)]

    def _verdict(self, round_, tokens, accepted=0, **fields):
        self.committed += tokens
        msg = verifier_pb2.Verdict(round=round_, tokens=tokens, committed_len=len(
            self.committed), stats=common_pb2.RoundStats(num_accepted=accepted), **fields)
        if len(self.committed) - len(CONTEXT) >= len(TRUTH):
            msg.finish_reason = common_pb2.FINISH_REASON_LENGTH
        elif not fields.get("catching_up"):
            msg.next_draft_tokens = self.plan(round_)
            self.owed = self.catch_up if msg.next_draft_tokens else 0
        return msg

    def verify(self, block: verifier_pb2.DraftBlock):
        if block.base_len > len(self.committed):
            return verifier_pb2.Verdict(round=block.round, is_stale=True)
        drafted = tokens_after(block, self.committed[block.base_len:])
        accepted = 0
        for token in drafted:
            if len(self.committed) - len(CONTEXT) + accepted + 1 >= len(TRUTH) or (
                    token != TRUTH[len(self.committed) - len(CONTEXT) + accepted]):
                break
            accepted += 1
        tokens = TRUTH[len(self.committed) - len(CONTEXT):][:accepted + 1]
        return self._verdict(block.round, tokens, accepted)

    def alone(self, round_):
        return self._verdict(round_, [self._next()])

    def caught_up(self, round_):
        if not self.owed:
            return None
        self.owed -= 1
        return self._verdict(round_, [self._next()], catching_up=True)


def draft(action: act.Draft) -> verifier_pb2.DraftBlock:
    """k tokens after the context: the target's, except every 5th position is wrong."""
    start = len(action.context) - len(CONTEXT)
    tokens = [TRUTH[p] if p % 5 != 3 else 0 for p in range(start, min(start + K, len(TRUTH)))]
    return verifier_pb2.DraftBlock(round=action.round, base_len=len(action.context),
                                   tokens=tokens, source="model")


def converse(target: Target, planned=True):
    drafter = DrafterSession(verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(
        plan_drafts=planned)), list(CONTEXT), planned=planned)
    verifier = VerifierSession()
    up, down, relayed = deque(), deque(), []

    def drafter_does(action):
        match action:
            case act.Send(request):
                up.append(request)
            case act.Draft():
                return ev.Drafted(draft(action))
            case act.Receive():
                return ev.classify(down.popleft())
            case act.Relay(msg):
                relayed.append(msg)
            case act.Finish():
                up.append(None)
            case act.Fail(reason):
                raise AssertionError(reason)

    def verifier_does(action):
        match action:
            case act.Read():
                request = up.popleft()
                return ev.Ended() if request is None else ev.classify_request(request)
            case act.Admit():
                return ev.Admitted()
            case act.Plan():
                return ev.Planned(verifier_pb2.Verdict(next_draft_tokens=target.plan(-1)))
            case act.Verify(block):
                return ev.Verified(target.verify(block))
            case act.DecodeAlone(round_):
                return ev.Verified(target.alone(round_))
            case act.CatchUp(round_):
                msg = target.caught_up(round_)
                return ev.Idle() if msg is None else ev.Verified(msg)
            case act.Reply(msg):
                down.append(msg)

    sides = [(drafter, deque(drafter.start()), drafter_does, down, act.Receive),
             (verifier, deque(verifier.start()), verifier_does, up, act.Read)]
    while any(todo for _, todo, *_ in sides):
        moved = False
        for machine, todo, does, inbox, waits in sides:
            while todo and not (isinstance(todo[0], waits) and not inbox):
                answer = does(todo.popleft())
                if answer is not None:
                    todo.extend(machine.on(answer))
                moved = True
        assert moved, "the two sides wait for each other"
    return relayed, drafter


def committed(relayed):
    return [t for msg in relayed for t in msg.tokens]


@pytest.mark.parametrize("plan", [
    lambda r: K,                                  # always drafting
    lambda r: 0 if 2 <= r <= 6 else K,            # alone for a stretch, then drafting again
    lambda r: 0 if r % 3 == 0 else 2,             # in and out of decoding alone
    lambda r: 0,                                  # alone from the open to the end
])
def test_every_plan_commits_exactly_the_targets_tokens(plan):
    relayed, drafter = converse(Target(plan))
    assert committed(relayed) == TRUTH and drafter.done
    assert drafter.committed == CONTEXT + TRUTH
    assert [m.round for m in relayed] == sorted({m.round for m in relayed})


def test_rounds_caught_up_while_blocks_travel_stay_exact():
    relayed, drafter = converse(Target(lambda r: 0 if r in (3, 4) else K, catch_up=2))
    assert committed(relayed) == TRUTH and drafter.committed == CONTEXT + TRUTH
    assert any(m.catching_up for m in relayed)


def test_an_unplanned_session_drafts_every_round():
    relayed, _ = converse(Target(lambda r: K), planned=False)
    assert committed(relayed) == TRUTH and all(m.stats.num_accepted <= K for m in relayed)
