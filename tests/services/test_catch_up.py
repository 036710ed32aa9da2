"""Catching up, in units: which sessions the verifier decodes alone while their block is on its
way, and where such a block is verified from."""

from types import SimpleNamespace

from cascade.v1 import verifier_pb2
from verifier_service.catch_up import catches_up, rebased


class Planner:
    def __init__(self, asked=(), drafting=()) -> None:
        self.asked, self.drafting, self.shadows = set(asked), set(drafting), []

    def catches_up(self, sequence) -> bool:
        return sequence.name in self.asked

    def is_drafting(self, sequence) -> bool:
        return sequence.name in self.drafting

    def shadow(self, sequence, base_len, tokens) -> None:
        self.shadows.append((base_len, tokens))


def session(name, committed=(), finished=False, last_round=6):
    sequence = SimpleNamespace(name=name, committed=list(committed), is_finished=finished)
    return SimpleNamespace(sequence=sequence, last_round=last_round)


def test_only_a_session_asked_for_a_block_while_another_keeps_the_verifier_stepping():
    a, b, c = session("a"), session("b"), session("c")
    planner = Planner(asked={"a"}, drafting={"a", "b"})
    assert not catches_up(planner, a, [a, b])  # the only other session drafts too: wait
    assert catches_up(planner, a, [a, b, c])  # c is decoded alone: the verifier steps
    assert not catches_up(planner, b, [a, b, c])  # b was not asked (a tree, sampled, ...)
    assert not catches_up(planner, session("a", finished=True), [a, c])


def test_a_block_is_verified_from_where_the_rounds_decoded_alone_leave_it():
    block = verifier_pb2.DraftBlock(session_id="s", epoch=2, round=4, base_len=3,
                                    tokens=[7, 8, 9, 10], draft_us=900)
    planner = Planner()
    agrees = rebased(planner, session("s", [1, 2, 3, 7, 8]), block)
    assert (list(agrees.tokens), agrees.base_len, agrees.round) == ([9, 10], 5, 7)
    assert (agrees.session_id, agrees.epoch, agrees.draft_us) == ("s", 2, 900)
    assert planner.shadows == [(3, [7, 8])]  # its committed positions, scored like a shadow
    differs = rebased(planner, session("s", [1, 2, 3, 7, 5]), block)
    assert list(differs.tokens) == [] and differs.base_len == 5
    consumed = rebased(planner, session("s", [1, 2, 3, 7, 8, 9, 10, 11]), block)
    assert list(consumed.tokens) == [] and consumed.base_len == 8
    assert planner.shadows[-1] == (3, [7, 8, 9, 10])
    assert list(block.tokens) == [7, 8, 9, 10]  # the block itself is left as it came


def test_rounds_decoded_alone_meanwhile_do_not_count_as_the_blocks_arrival():
    from verifier_service.planner import DraftPlanner

    planner, sequence = DraftPlanner(cost=None), object()
    planner.enroll(sequence, "model", shadowed=True)
    trip = planner.sessions[id(sequence)].trip
    trip.asked_at = 10.0
    planner.await_block(sequence)
    planner.arrived(sequence, 10.001)  # a catching-up round reaches the scheduler
    assert trip.asked_at == 10.0 and trip.wait_s is None
    assert planner.is_awaiting(sequence)
    planner.block_came(sequence)
    assert not planner.is_awaiting(sequence)
    planner.arrived(sequence, 10.05)  # the block
    assert trip.asked_at is None and abs(trip.wait_s - 0.05) < 1e-9
