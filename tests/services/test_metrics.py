"""The verifier's speculative-decoding counters are read from one SpecStats at scrape time."""

from prometheus_client import CollectorRegistry, generate_latest

from cascade.protocol.stats import SpecStats
from cascade.serving.metrics import SpecStatsCollector


def test_counters_follow_the_stats_they_read():
    stats = SpecStats()
    registry = CollectorRegistry()
    registry.register(SpecStatsCollector(stats))
    stats.observe(4, 2, 3, num_deferred=1)
    stats.observe(3, 3, 4)
    text = generate_latest(registry).decode()
    for line in ("cascade:spec_decode_num_drafts_total 2.0",
                 "cascade:spec_decode_num_draft_tokens_total 7.0",
                 "cascade:spec_decode_num_accepted_tokens_total 5.0",
                 "cascade:spec_decode_num_deferred_tokens_total 1.0",
                 'cascade:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1.0'):
        assert line in text, line
