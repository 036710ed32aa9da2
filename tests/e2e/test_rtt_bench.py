"""The round-trip benchmark on the tiny pair: a row per delay, identical tokens at every delay
(delay changes timing only), and every round at least as long as the injected round trip."""

from cascade.bench.rtt import measure, table


def test_the_rtt_benchmark_measures_each_delay(tiny_pair_dirs, tmp_path):
    rows = measure(*tiny_pair_dirs, [0.0, 15.0], tmp_path, max_tokens=12, k=3,
                   prompts=("import os",))
    assert [r.one_way_ms for r in rows] == [0.0, 15.0]
    assert rows[0].tokens == rows[1].tokens and rows[0].num_tokens == 12
    assert rows[1].round_ms >= 30.0  # each round crosses the 15 ms link twice
    assert 0.0 <= rows[1].verifier_idle <= 1.0
    assert "| 15 |" in table(rows)
