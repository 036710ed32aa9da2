"""The verifier's state machine, one test per row of its table (cascade.session.verifier)."""

import pytest

from cascade.session import actions as act
from cascade.session import events as ev
from cascade.session.drafter import ProtocolError
from cascade.session.verifier import FIRST_ONLY, VerifierPhase, VerifierSession
from cascade.v1 import common_pb2, verifier_pb2


def open_msg(plan=False, features=()):
    return verifier_pb2.SessionOpen(session_id="s", epoch=1, context_tokens=[1, 2, 3],
                                    plan_drafts=plan, feature_layers=features)


def verdict(round_=0, tokens=(5,), plan=None, **fields):
    msg = verifier_pb2.Verdict(session_id="s", epoch=1, round=round_, tokens=tokens, **fields)
    if plan is not None:
        msg.next_draft_tokens = plan
    return msg


def opened(**kwargs):
    session = VerifierSession()
    session.on(ev.Open(open_msg(**kwargs)))
    session.on(ev.Admitted())
    return session


def kinds(actions):
    return [type(a).__name__ for a in actions]


def test_the_first_request_is_read_and_an_open_admitted():
    session = VerifierSession()
    assert session.start() == [act.Read()]
    assert session.on(ev.Open(open_msg())) == [act.Admit(open_msg())]
    assert session.phase is VerifierPhase.OPENING


@pytest.mark.parametrize("event", [ev.Block(verifier_pb2.DraftBlock()),
                                   ev.Shadow(verifier_pb2.ShadowBlock()),
                                   ev.Ready(verifier_pb2.DraftReady())])
def test_anything_before_the_open_fails_the_stream(event):
    assert VerifierSession().on(event) == [act.Fail(FIRST_ONLY)]


@pytest.mark.parametrize("plan,features,expected", [
    (False, (), ["Read"]), (False, (3,), ["ReplyFeatures", "Read"]),
    (True, (), ["Plan"]), (True, (3,), ["ReplyFeatures", "Plan"])])
def test_an_admitted_open_is_answered_with_features_and_a_plan_as_asked(plan, features,
                                                                         expected):
    session = VerifierSession()
    session.on(ev.Open(open_msg(plan, features)))
    assert kinds(session.on(ev.Admitted())) == expected


def test_a_plan_of_zero_is_sent_and_the_session_decoded_alone_from_round_zero():
    session = opened(plan=True)
    plan = verdict(tokens=(), plan=0)
    assert session.on(ev.Planned(plan)) == [act.Reply(plan), act.DecodeAlone(0)]
    assert session.phase is VerifierPhase.ALONE


def test_a_plan_for_drafts_catches_up_while_the_first_block_is_on_its_way():
    session = opened(plan=True)
    assert kinds(session.on(ev.Planned(verdict(tokens=(), plan=4)))) == ["Reply", "CatchUp"]


def test_a_block_is_verified_and_its_verdict_sent():
    session = opened()
    block = verifier_pb2.DraftBlock(round=0)
    assert session.on(ev.Block(block)) == [act.Verify(block)]
    msg = verdict(0, plan=4)
    assert session.on(ev.Verified(msg)) == [act.Reply(msg), act.CatchUp(1)]


def test_a_verdict_asking_for_no_drafts_goes_on_decoding_alone():
    session = opened()
    session.on(ev.Block(verifier_pb2.DraftBlock(round=0)))
    assert session.on(ev.Verified(verdict(0, plan=0)))[1] == act.DecodeAlone(1)
    assert session.on(ev.Verified(verdict(1, plan=0)))[1] == act.DecodeAlone(2)
    assert session.on(ev.Verified(verdict(2, plan=3)))[1] == act.CatchUp(3)


@pytest.mark.parametrize("last", [
    verdict(0, finish_reason=common_pb2.FINISH_REASON_STOP), verdict(0, is_stale=True)])
def test_a_last_or_stale_verdict_is_sent_and_the_next_request_read(last):
    session = opened()
    session.on(ev.Block(verifier_pb2.DraftBlock(round=0)))
    assert session.on(ev.Verified(last)) == [act.Reply(last), act.Read()]


def test_catching_up_goes_on_until_idle_then_reads():
    session = opened()
    session.on(ev.Block(verifier_pb2.DraftBlock(round=0)))
    session.on(ev.Verified(verdict(0)))
    caught_up = verdict(1, catching_up=True)
    assert session.on(ev.Verified(caught_up)) == [act.Reply(caught_up), act.CatchUp(2)]
    assert session.on(ev.Idle()) == [act.Read()]
    assert session.phase is VerifierPhase.WAITING


def test_a_dropped_block_reads_on_and_a_resent_one_is_not_answered_twice():
    session = opened()
    session.on(ev.Block(verifier_pb2.DraftBlock(round=1)))
    assert session.on(ev.Verified(None)) == [act.Read()]
    session.on(ev.Block(verifier_pb2.DraftBlock(round=1)))
    assert session.on(ev.Verified(verdict(0), new=False)) == [act.CatchUp(1)]


def test_shadows_and_ready_notes_are_handled_in_any_phase_after_the_open():
    session = opened(plan=True)
    shadow, ready = verifier_pb2.ShadowBlock(base_len=2), verifier_pb2.DraftReady(num_tokens=3)
    assert session.on(ev.Shadow(shadow)) == [act.Score(shadow)]
    assert session.on(ev.Ready(ready)) == [act.NoteReady(ready)]
    assert session.phase is VerifierPhase.OPENING


def test_the_drafter_closing_its_side_ends_the_session():
    session = opened()
    assert session.on(ev.Ended()) == [] and session.phase is VerifierPhase.DONE


def test_a_block_while_one_is_verified_is_a_protocol_error():
    session = opened()
    session.on(ev.Block(verifier_pb2.DraftBlock(round=0)))
    with pytest.raises(ProtocolError):
        session.on(ev.Block(verifier_pb2.DraftBlock(round=1)))


def test_requests_are_classified_by_their_kind():
    block = verifier_pb2.DraftBlock(round=2)
    assert ev.classify_request(verifier_pb2.VerifyRequest(block=block)) == ev.Block(block)
    with pytest.raises(ValueError, match="set one of"):
        ev.classify_request(verifier_pb2.VerifyRequest())
