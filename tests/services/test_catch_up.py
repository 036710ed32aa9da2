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
                                    tokens=[7, 8, 9, 10], draft_us=900,
                                    survival=[0.9, 0.8, 0.5, 0.25],
                                    proposals=[verifier_pb2.SparseDistribution(token_ids=[t])
                                               for t in (7, 8, 9, 10)])
    planner = Planner()
    agrees = rebased(planner, session("s", [1, 2, 3, 7, 8]), block)
    assert (list(agrees.tokens), agrees.base_len, agrees.round) == ([9, 10], 5, 7)
    assert list(agrees.survival) == [0.5, 0.25]  # each token's values stay with it
    assert [list(p.token_ids) for p in agrees.proposals] == [[9], [10]]
    assert (agrees.session_id, agrees.epoch, agrees.draft_us) == ("s", 2, 900)
    assert planner.shadows == [(3, [7, 8])]  # its committed positions, scored like a shadow
    differs = rebased(planner, session("s", [1, 2, 3, 7, 5]), block)
    assert list(differs.tokens) == [] and differs.base_len == 5
    assert list(differs.survival) == [] and list(differs.proposals) == []
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


async def test_a_block_sent_ahead_for_the_asking_verdict_is_taken_after_rounds_caught_up(
        gpt2_pair):
    """Speculation ahead with catching up: the drafter sends the next block ahead, tagged with
    the outcome of the verdict that asked for it; rounds decoded alone move the session on
    before it comes. It is that verdict's block (the drafter counts it as an ahead hit and
    never sends it again), so it is verified from where those rounds leave it, like a plain
    block; one on a wrong guess is dropped and the session goes on awaiting."""
    from cascade.protocol.settings import SamplingParams
    from cascade.protocol.wire.convert import sampling_to_pb
    from models import hf_greedy, random_prompts
    from plans import CHEAP
    from verifier_service.server import build_verifier

    target, _ = gpt2_pair
    _, sessions = build_verifier(target, grace_s=1.0, step_cost=CHEAP)
    prompt = random_prompts(1, seed=47)[0]
    expected = hf_greedy(target, prompt, 20)
    session = await sessions.open(verifier_pb2.SessionOpen(
        session_id="s", epoch=1, context_tokens=prompt, prompt_len=len(prompt),
        sampling=sampling_to_pb(SamplingParams(max_new_tokens=20)), plan_drafts=True,
        shadow_drafts=True, num_draft_tokens=4, draft_method="model"))

    def block(round_number, done, tokens, **fields):
        return verifier_pb2.DraftBlock(session_id="s", epoch=1, round=round_number,
                                       base_len=len(prompt) + done, tokens=tokens, **fields)

    try:
        asking = await sessions.verify(session, block(0, 0, expected[:4]))
        assert asking.stats.num_accepted == 4 and asking.next_draft_tokens > 0
        for round_number in (1, 2):  # decoded alone while the block is on its way
            assert (await sessions.catch_up(session, round_number)).catching_up
        outcome = verifier_pb2.Outcome(num_accepted=4, next_token=expected[4])
        wrong = verifier_pb2.Outcome(num_accepted=3, next_token=expected[4])
        assert await sessions.verify(session, block(1, 5, [1, 2], assumes=wrong)) is None
        assert sessions.awaits_block(session)  # a wrong guess is not the awaited block
        verdict = await sessions.verify(session, block(1, 5, expected[5:9], assumes=outcome))
        assert verdict is not None and not verdict.is_stale
        assert (verdict.round, verdict.stats.num_accepted) == (3, 2)  # its 2 tokens past the rounds
        assert session.sequence.committed == prompt + expected[:10]
        assert not sessions.awaits_block(session)
    finally:
        await sessions.close(session)

