"""The drafter's hop of a round's statistics: the verdict's part, its own added, relayed whole."""

from cascade.v1 import common_pb2, verifier_pb2
from drafter_service.relay import relayed_round


def test_a_relayed_round_carries_the_verdicts_statistics_and_the_drafters():
    block = verifier_pb2.DraftBlock(tokens=[5, 6, 7, 8], draft_us=1200, source="ngram")
    verdict = verifier_pb2.Verdict(round=3, tokens=[5, 9], num_verified=2,
                                   stats=common_pb2.RoundStats(num_accepted=1, verify_us=800,
                                                               num_deferred=1))
    result = relayed_round(verdict, block, common_pb2.SPECULATION_CACHE_HIT, None, round_us=2500)
    assert list(result.drafted_tokens) == [5, 6] and list(result.tokens) == [5, 9]
    assert result.stats == common_pb2.RoundStats(
        num_accepted=1, num_drafted=2, num_unverified=2, num_deferred=1, draft_us=1200,
        verify_us=800, round_us=2500, speculation=common_pb2.SPECULATION_CACHE_HIT,
        draft_source="ngram")


def test_an_undrafted_round_names_no_source_and_nothing_unverified():
    verdict = verifier_pb2.Verdict(round=0, tokens=[4], stats=common_pb2.RoundStats(verify_us=5))
    result = relayed_round(verdict, verifier_pb2.DraftBlock(), common_pb2.SPECULATION_UNSPECIFIED,
                           None, round_us=9)
    assert result.stats == common_pb2.RoundStats(verify_us=5, round_us=9)
