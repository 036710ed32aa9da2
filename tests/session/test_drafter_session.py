"""The drafter's state machine, one test per row of its table (cascade.session), with no
transport and no model."""

import pytest

from cascade.session import actions as act
from cascade.session import events as ev
from cascade.session.drafter import EMPTY_BLOCK, DrafterSession, Phase, ProtocolError
from cascade.v1 import common_pb2, verifier_pb2

OPEN = verifier_pb2.VerifyRequest(open=verifier_pb2.SessionOpen(session_id="s", epoch=1))
STOP = common_pb2.FINISH_REASON_STOP


def verdict(round_=0, tokens=(), plan=None, finish=None, features=False, **stats):
    msg = verifier_pb2.Verdict(session_id="s", epoch=1, round=round_, tokens=tokens,
                               stats=common_pb2.RoundStats(**stats))
    if plan is not None:
        msg.next_draft_tokens = plan
    if finish is not None:
        msg.finish_reason = finish
    if features:
        msg.features.start = 0
    return msg


def block(round_=0, tokens=(7, 8, 9), base_len=3):
    return verifier_pb2.DraftBlock(session_id="s", epoch=1, round=round_, tokens=tokens,
                                   base_len=base_len, source="model")


def kinds(actions):
    return [type(a).__name__ for a in actions]


def verifying(speculates=False, **fields):
    """A session whose first block (``block()``) is with the verifier."""
    session = DrafterSession(OPEN, [1, 2, 3], speculates=speculates, **fields)
    session.start()
    session.on(ev.Drafted(block()))
    return session


def test_an_open_with_no_replies_due_begins_and_drafts_the_first_block():
    session = DrafterSession(OPEN, [1, 2, 3])
    actions = session.start()
    assert kinds(actions) == ["Send", "Begin", "Draft"]
    assert actions[0].request is OPEN
    assert actions[2] == act.Draft(0, [1, 2, 3], ev.UNDRAFTED, None)
    assert session.phase is Phase.DRAFTING
    assert DrafterSession(OPEN, [1], speculates=True).start()[2].origin == ev.MISS


def test_opening_reads_each_feature_reply_then_the_plan_then_drafts():
    session = DrafterSession(OPEN, [1, 2, 3], open_replies=2, planned=True)
    assert kinds(session.start()) == ["Send", "Receive"]
    assert kinds(session.on(ev.Verdict(verdict(features=True)))) == ["Observe", "Receive"]
    assert kinds(session.on(ev.Verdict(verdict(features=True)))) == ["Observe", "Receive"]
    actions = session.on(ev.Verdict(verdict(plan=3)))
    assert kinds(actions) == ["Observe", "Begin", "Draft"]
    assert session.planned_length == 3 and session.phase is Phase.DRAFTING


def test_a_plan_of_zero_at_the_open_leaves_the_session_to_the_verifier():
    session = DrafterSession(OPEN, [1, 2, 3], planned=True)
    session.start()
    assert kinds(session.on(ev.Verdict(verdict(plan=0)))) == [
        "Observe", "Begin", "StartAlone", "Receive"]
    assert session.phase is Phase.ALONE


@pytest.mark.parametrize("speculates", [False, True])
def test_a_drafted_block_is_sent_and_its_verdict_awaited(speculates):
    session = DrafterSession(OPEN, [1, 2, 3], speculates=speculates)
    session.start()
    actions = session.on(ev.Drafted(block(), ev.MISS))
    assert actions[0] == act.Send(ev.block_request(block()))
    assert actions[1] == act.Receive(block() if speculates else None)
    assert session.phase is Phase.VERIFYING


def test_a_block_that_went_ahead_is_not_sent_again():
    session = DrafterSession(OPEN, [1, 2, 3], speculates=True)
    session.start()
    assert kinds(session.on(ev.Drafted(block(), ev.AHEAD_HIT))) == ["Receive"]


def test_a_verdict_commits_judges_relays_and_drafts_the_next_block_from_the_predrafts():
    session = verifying(speculates=True)
    msg = verdict(0, tokens=[7, 5], num_accepted=1)
    actions = session.on(ev.Verdict(msg))
    assert kinds(actions) == ["Judge", "Relay", "Draft"]
    assert actions[1] == act.Relay(msg, block(), ev.UNDRAFTED, True)
    assert actions[2] == act.Draft(1, [1, 2, 3, 7, 5], ev.UNDRAFTED, msg)
    assert session.committed == [1, 2, 3, 7, 5]


def test_a_verdict_without_predrafts_drafts_the_next_block_now():
    actions = verifying().on(ev.Verdict(verdict(0, tokens=[7, 5])))
    assert actions[-1].after is None


def test_the_last_verdict_finishes_the_session():
    session = verifying()
    actions = session.on(ev.Verdict(verdict(0, tokens=[7, 2], finish=STOP)))
    assert kinds(actions) == ["Judge", "Relay", "Finish"] and session.done


def test_a_verdict_asking_for_no_drafts_leaves_the_session_to_the_verifier():
    session = verifying()
    actions = session.on(ev.Verdict(verdict(0, tokens=[7, 5], plan=0)))
    assert kinds(actions) == ["Observe", "Judge", "Relay", "StartAlone", "Receive"]
    assert session.phase is Phase.ALONE


def test_rounds_caught_up_are_relayed_and_the_block_is_judged_from_where_they_left_it():
    session = verifying(speculates=True)
    actions = session.on(ev.CaughtUp(verdict(0, tokens=[7])))
    assert actions == [act.Relay(verdict(0, tokens=[7]), EMPTY_BLOCK), act.Receive()]
    assert session.committed == [1, 2, 3, 7]
    msg = verdict(1, tokens=[8, 4], num_accepted=1)
    judge, relay, draft = session.on(ev.Verdict(msg))
    assert list(judge.block.tokens) == [8, 9] and relay.predrafted is False
    assert draft == act.Draft(2, [1, 2, 3, 7, 8, 4], ev.UNDRAFTED, None)


def test_a_block_whose_first_tokens_differ_from_the_rounds_caught_up_keeps_none():
    session = verifying()
    session.on(ev.CaughtUp(verdict(0, tokens=[6])))
    judge = session.on(ev.Verdict(verdict(1, tokens=[4])))[0]
    assert list(judge.block.tokens) == []


def test_a_round_caught_up_that_ends_the_generation_finishes():
    session = verifying()
    assert kinds(session.on(ev.CaughtUp(verdict(0, tokens=[2], finish=STOP)))) == [
        "Relay", "Finish"]


def alone():
    session = verifying()
    session.on(ev.Verdict(verdict(0, tokens=[7, 5], plan=0)))
    return session


def test_rounds_decoded_alone_are_relayed_followed_and_offer_a_ready_draft_once():
    session = alone()
    actions = session.on(ev.Verdict(verdict(1, tokens=[6], plan=0)))
    assert kinds(actions) == ["Observe", "Relay", "Follow", "OfferReady", "Receive"]
    assert actions[1].block == EMPTY_BLOCK and actions[2].committed == [1, 2, 3, 7, 5, 6]
    assert session.on(ev.ReadyNoted()) == []
    assert "OfferReady" not in kinds(session.on(ev.Verdict(verdict(2, tokens=[6], plan=0))))


def test_a_round_alone_asking_for_drafts_again_stops_the_shadows_and_drafts():
    session = alone()
    actions = session.on(ev.Verdict(verdict(1, tokens=[6], plan=4)))
    assert kinds(actions) == ["Observe", "Relay", "Follow", "StopAlone", "Draft"]
    assert actions[-1] == act.Draft(2, [1, 2, 3, 7, 5, 6], ev.UNDRAFTED, None)
    assert session.planned_length == 4


def test_a_round_alone_that_ends_the_generation_stops_the_shadows_and_finishes():
    session = alone()
    assert kinds(session.on(ev.Verdict(verdict(1, tokens=[2], finish=STOP)))) == [
        "Relay", "Follow", "StopAlone", "Finish"]
    assert session.done


@pytest.mark.parametrize("make", [lambda: DrafterSession(OPEN, [1], planned=True), verifying,
                                  alone])
def test_a_stale_verdict_fails_the_session_in_any_phase(make):
    session = make()
    session.start() if session.phase is Phase.OPENING else None
    stale = verifier_pb2.Verdict(is_stale=True)
    assert ev.classify(stale) == ev.Stale(stale)
    assert kinds(session.on(ev.classify(stale))) == ["Fail"] and session.done


@pytest.mark.parametrize("make,event", [
    (verifying, ev.Drafted(block())),
    (alone, ev.CaughtUp(verdict(1, tokens=[1]))),
    (lambda: DrafterSession(OPEN, [1]), ev.Verdict(verdict())),  # drafting: no verdict due
])
def test_an_event_the_phase_does_not_expect_is_a_protocol_error(make, event):
    session = make()
    if session.phase is Phase.OPENING:
        session.start()
    with pytest.raises(ProtocolError, match="while the session is"):
        session.on(event)
