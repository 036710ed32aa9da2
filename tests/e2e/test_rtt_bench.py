"""The round-trip benchmark on the tiny pair: a row per (speculation mode, delay), identical
tokens in every row (delay and speculation change timing only), every lock-step round at least
as long as the injected round trip, and the speculating rows' rounds tagged by where their block
came from (one delay: each row is a cluster of its own; the ratios' arithmetic is tested
below without one)."""

from cascade.bench.load.rtt import RttRow, measure, recovered, table
from cascade.v1 import common_pb2

ORIGINS = {common_pb2.SPECULATION_MISS, common_pb2.SPECULATION_CACHE_HIT,
           common_pb2.SPECULATION_AHEAD_HIT}


def test_the_rtt_benchmark_measures_each_mode_and_delay(tiny_pair_dirs, tmp_path):
    rows = measure(*tiny_pair_dirs, [15.0], tmp_path, max_tokens=12, k=3,
                   prompts=("import os",), modes=("off", "ahead"))
    assert [(r.mode, r.one_way_ms) for r in rows] == [("off", 15.0), ("ahead", 15.0)]
    assert all(r.tokens == rows[0].tokens for r in rows) and rows[0].num_tokens == 12
    assert rows[0].round_ms >= 30.0  # each lock-step round crosses the 15 ms link twice
    assert all(0.0 <= r.verifier_idle <= 1.0 for r in rows)
    assert set(rows[0].origins) == {common_pb2.SPECULATION_UNSPECIFIED}
    assert set(rows[1].origins) <= ORIGINS and sum(rows[1].origins.values()) > 0
    text = table(rows)
    assert "| off | 15 |" in text and "| ahead | 15 |" in text


def test_the_share_of_the_round_trips_cost_won_back():
    def row(mode, delay, tokens_per_s):
        return RttRow(delay, mode, tokens=[[0] * int(tokens_per_s)], wall_s=1.0)

    rows = [row("off", 0.0, 10), row("off", 20.0, 6), row("ahead", 20.0, 8)]
    assert recovered(rows, 20.0, "ahead") == 0.5
    assert recovered(rows, 50.0, "ahead") is None  # not measured
    assert recovered([row("off", 0.0, 6), row("off", 20.0, 6), row("ahead", 20.0, 8)],
                     20.0, "ahead") is None  # the round trip cost nothing
