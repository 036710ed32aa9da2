"""The load benchmark's pooling of repeated runs and its comparison table, on made-up points."""

from cascade.bench.load.sweep import Point, pooled
from cascade.bench.load.report import comparison


def _row(mode: str, tokens_per_s: float, p99: float, repeat=None) -> dict:
    return {"mode": mode, "sessions": 4, "soak": False, "window_s": 10.0, "repeat": repeat,
            "tokens_per_s": tokens_per_s, "itl_p50_ms": 1.0, "itl_p99_ms": p99,
            "ttft_p50_ms": 1.0, "requests": 1, "errors": 0, "mean_drafted": 0.0,
            "rounds_at_0": 1.0}


def test_pooled_points_sum_tokens_over_summed_windows_and_take_percentiles_over_every_gap():
    one = Point("auto (k <= 4)", 4, 10.0, tokens=100, itl_s=[0.01] * 99 + [1.0], drafted=[0, 2])
    two = Point("auto (k <= 4)", 4, 10.0, tokens=300, itl_s=[0.01] * 100, drafted=[0, 0])
    row = pooled([one, two]).row()
    assert row["tokens_per_s"] == 20.0
    assert row["window_s"] == 20.0 and row["repeat"] is None
    assert 10.0 <= row["itl_p99_ms"] < 1000.0  # one slow gap in 200 sits near p99, not at it
    assert row["rounds_at_0"] == 0.75
    assert one.row()["itl_p99_ms"] > 10.0


def test_comparison_gives_each_runs_ratio_range_beside_the_pooled_ratio():
    result = {"points": [_row("target-only, batched", 100.0, 50.0),
                         _row("fixed k=1", 80.0, 90.0), _row("auto (k <= 4)", 98.0, 60.0)],
              "runs": [_row("target-only, batched", 90.0, 50.0, 0),
                       _row("fixed k=1", 95.0, 90.0, 0),
                       _row("auto (k <= 4)", 76.0, 40.0, 0),
                       _row("target-only, batched", 110.0, 50.0, 1),
                       _row("fixed k=1", 65.0, 90.0, 1), _row("auto (k <= 4)", 121.0, 80.0, 1)]}
    text = comparison(result)
    assert "auto / best per run | ITL p99 ratio per run |" in text
    # pooled: 98 / 100 and 60 / 50; per run: 76 / 95, 121 / 110 and 40 / 50, 80 / 50
    assert "| 4 | 100.0 | 80.0 (k=1) | 98.0 | 0.98 | 1.20 | 0.80-1.10 | 0.80-1.60 |" in text
    del result["runs"]
    assert comparison(result).splitlines()[-1] == "| 4 | 100.0 | 80.0 (k=1) | 98.0 | 0.98 | 1.20 |"
