"""Prometheus metrics, with vLLM's names under the ``cascade:`` prefix.

Each service exposes only its own: the gateway's ``/metrics`` (``GATEWAY``) counts every round
it streams to clients, so acceptance is read there; drafters and verifiers serve theirs
(``DRAFTER``, ``VERIFIER``) on ``--metrics-port``. Every sample carries vLLM's ``model_name``
label. Counters are exposed with a ``_total`` suffix and no ``_created`` series. Definitions
(as vLLM's): acceptance rate = rate(cascade:spec_decode_num_accepted_tokens_total)
/ rate(cascade:spec_decode_num_draft_tokens_total); mean acceptance length = 1 + rate(accepted
tokens) / rate(cascade:spec_decode_num_drafts_total) (the bonus token included). A dashboard
built for vLLM reads them after one relabelling, ``cascade:(.*)`` to ``vllm:$1``
(docs/deploy.md).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client import disable_created_metrics, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cascade.protocol.stats import SpecStats

disable_created_metrics()
GATEWAY = CollectorRegistry()
VERIFIER = CollectorRegistry()
DRAFTER = CollectorRegistry()
REGISTRIES = {"gateway": GATEWAY, "verifier": VERIFIER, "drafter": DRAFTER}

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                   0.75, 1.0, 2.5, 5.0, 10.0, 30.0)

class SpecStatsCollector:
    """Exposes a SpecStats as vLLM-named counters (``<prefix>spec_decode_...``), read at scrape
    time."""

    def __init__(self, stats: SpecStats, prefix: str = "cascade:") -> None:
        self.stats, self.prefix = stats, prefix

    def collect(self):
        s = self.stats
        for name, doc, value in (
                ("num_drafts", "Rounds that verified >= 1 drafted token.", s.num_drafts),
                ("num_draft_tokens", "Drafted tokens verified.", s.num_draft_tokens),
                ("num_accepted_tokens", "Drafted tokens accepted.", s.num_accepted_tokens),
                ("num_deferred_tokens", "Cascade rules: verified drafted positions the "
                 "target's distribution decided.", s.num_deferred_tokens),
                ("num_forced_tokens", "Structured outputs: emitted tokens at positions the "
                 "grammar forced (drafted or filled).", s.num_forced_tokens),
                ("num_filled_tokens", "Structured outputs: forced tokens the verifier filled "
                 "in after its own token, without a pass (jump-forward).",
                 s.num_filled_tokens)):
            yield CounterMetricFamily(f"{self.prefix}spec_decode_{name}", doc, value=value)
        per_pos = CounterMetricFamily(f"{self.prefix}spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted drafted tokens by position in the block "
                                      "(0-based).", labels=["position"])
        for position, count in enumerate(s.accepted_per_position):
            per_pos.add_metric([str(position)], count)
        yield per_pos


SPEC_STATS = SpecStats()
"""Every round the gateway streamed to a client (replayed ones once)."""
GATEWAY.register(SpecStatsCollector(SPEC_STATS))
VERIFIER_SPEC_STATS = SpecStats()
"""Every round this verifier verified (rounds of streams that broke included)."""
VERIFIER.register(SpecStatsCollector(VERIFIER_SPEC_STATS, "cascade:verifier_"))
VERIFIER_QUEUE_DEPTH = Gauge("cascade:verifier_queue_depth",
                             "Blocks waiting for the verifier's next engine step.",
                             registry=VERIFIER)
VERIFIER_SESSIONS = Gauge("cascade:verifier_active_sessions",
                          "Sessions open on the verifier, each holding KV memory (vLLM's "
                          "num_requests_running).", registry=VERIFIER)
REQUESTS_WAITING = Gauge("cascade:num_requests_waiting",
                         "Sessions waiting for the verifier's KV memory to admit them.",
                         registry=VERIFIER)
KV_CACHE_USAGE = Gauge("cascade:kv_cache_usage_perc",
                       "Share of the verifier's KV blocks held by open sessions (0..1; cached "
                       "blocks nobody holds count as free).", registry=VERIFIER)
KV_BLOCKS = Gauge("cascade:kv_blocks", "The verifier's KV blocks by state: used (held by "
                  "sessions), cached (an ended prefix's, evictable), free.", ["state"],
                  registry=VERIFIER)
PREFIX_CACHE_QUERIES = Counter("cascade:prefix_cache_queries",
                               "Prompt positions new sessions looked up in the verifier's "
                               "prefix cache (vLLM's prefix_cache_queries).", registry=VERIFIER)
PREFIX_CACHE_HITS = Counter("cascade:prefix_cache_hits",
                            "Of those, positions whose keys and values a session took from a "
                            "live or ended sequence of its scope instead of computing them "
                            "(vLLM's prefix_cache_hits).", registry=VERIFIER)
NUM_PREEMPTIONS = Counter("cascade:num_preemptions",
                          "Sessions whose KV blocks were taken to make room for a pass; each "
                          "recomputes its context at its next pass (vLLM's num_preemptions).",
                          registry=VERIFIER)
VERIFIER_INVARIANT = Gauge("cascade:verifier_invariant_pass",
                           "1 when the verifier's passes are batch-invariant and the start-up "
                           "probe verified them on this machine (greedy output never depends "
                           "on k, batch or load); 0 otherwise.", registry=VERIFIER)
VERIFIER_BATCH_SIZE = Histogram("cascade:verifier_batch_size", "Items per engine step.",
                                buckets=(1, 2, 4, 8, 16, 32, 64), registry=VERIFIER)
VERIFIER_STEP_SECONDS = Histogram("cascade:verifier_step_seconds",
                                  "One engine step: the packed pass and every row's acceptance.",
                                  buckets=LATENCY_BUCKETS, registry=VERIFIER)
VERIFY_SECONDS = Histogram("cascade:verify_seconds", "Target pass plus acceptance per block.",
                           buckets=LATENCY_BUCKETS, registry=VERIFIER)
# Drafter.
DRAFTER_SESSIONS = Gauge("cascade:drafter_active_sessions", "Sessions running on the drafter.",
                         registry=DRAFTER)
DRAFT_SECONDS = Histogram("cascade:draft_seconds", "Drafting time per block.",
                          buckets=LATENCY_BUCKETS, registry=DRAFTER)
DRAFTED_BY_SOURCE = Counter("cascade:drafted_tokens_by_source", "Drafted tokens verified, and "
                            "those accepted, by what drafted them (model, ngram, suffix: the "
                            "session's own tokens, memory: the speculation memory).",
                            ["source", "outcome"], registry=DRAFTER)


class MemoryCollector:
    """The speculation memory's size and hit rate, read from the index when scraped."""

    def __init__(self, index) -> None:
        self.index = index

    def collect(self):
        size = GaugeMetricFamily("cascade:memory_indexed", "What the drafter's speculation "
                                 "memory holds.", labels=["unit"])
        size.add_metric(["sequences"], self.index.num_sequences)
        size.add_metric(["tokens"], self.index.num_tokens)
        lookups = CounterMetricFamily("cascade:memory_lookups", "Speculation-memory lookups, "
                                      "by whether they found a match.", labels=["result"])
        lookups.add_metric(["hit"], self.index.num_hits)
        lookups.add_metric(["miss"], self.index.num_lookups - self.index.num_hits)
        yield size
        yield lookups


def observe_drafted(source: str, num_drafted: int, num_accepted: int) -> None:
    if num_drafted:
        DRAFTED_BY_SOURCE.labels(source, "drafted").inc(num_drafted)
        DRAFTED_BY_SOURCE.labels(source, "accepted").inc(num_accepted)


# Drafting during verification (speculative speculative decoding).
SSD_ROUNDS = Counter("cascade:ssd_rounds", "Rounds whose block came from the speculation "
                     "cache, a block sent ahead, or (a miss) drafting after the verdict.",
                     ["outcome"], registry=DRAFTER)
SSD_PREDRAFTS = Counter("cascade:ssd_predrafted_blocks", "Blocks pre-drafted for guessed "
                        "outcomes while the verifier verified.", registry=DRAFTER)
SSD_WASTED = Counter("cascade:ssd_wasted_blocks", "Pre-drafted blocks whose guess was wrong.",
                     registry=DRAFTER)
SSD_SENT_AHEAD = Counter("cascade:ssd_sent_ahead_blocks", "Pre-drafted blocks sent to the "
                         "verifier before the verdict they guess.", registry=DRAFTER)
SSD_DROPPED_BLOCKS = Counter("cascade:ssd_dropped_blocks", "Blocks sent ahead that the "
                             "verifier dropped (they guessed the wrong outcome).",
                             registry=VERIFIER)
PLANNED_DRAFT_TOKENS = Histogram("cascade:planned_draft_tokens", "Drafted tokens the goodput "
                                 "planner had a planned session's round verify.",
                                 buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 32), registry=VERIFIER)
PLANNED_ZERO_ROUNDS = Counter("cascade:planned_zero_rounds", "Planned rounds after which the "
                              "session drafts nothing (the verifier decodes it alone).",
                              registry=VERIFIER)
SHADOW_DRAFT_TOKENS = Counter("cascade:shadow_draft_tokens", "Tokens of shadow blocks scored "
                              "(drafted from past contexts of sessions decoded alone).",
                              registry=VERIFIER)
CAUGHT_UP_ROUNDS = Counter("cascade:caught_up_rounds", "Rounds a planned session was decoded "
                           "alone while the block it was asked for was on its way.",
                           registry=VERIFIER)
# Gateway.
UNREPLICATED_APPENDS = Counter("cascade:unreplicated_appends", "Session appends no replica "
                               "acknowledged in time (--redis-wait-replicas): "
                               "each one broke its stream before the round was sent.",
                               registry=GATEWAY)
REQUESTS_RUNNING = Gauge("cascade:num_requests_running", "Generations in progress.",
                         registry=GATEWAY)
REQUESTS_FINISHED = Counter("cascade:request_success", "Generations finished.",
                            ["finished_reason"], registry=GATEWAY)
PROMPT_TOKENS = Counter("cascade:prompt_tokens", "Prompt tokens of admitted requests.",
                        registry=GATEWAY)
GENERATION_TOKENS = Counter("cascade:generation_tokens", "Tokens generated and sent.",
                            registry=GATEWAY)
TIME_TO_FIRST_TOKEN = Histogram("cascade:time_to_first_token_seconds",
                                "From request to the first committed chunk.",
                                buckets=LATENCY_BUCKETS, registry=GATEWAY)
INTER_TOKEN_LATENCY = Histogram("cascade:inter_token_latency_seconds",
                                "Between consecutive committed tokens (a chunk's gap spread "
                                "over its tokens).", buckets=LATENCY_BUCKETS, registry=GATEWAY)
E2E_REQUEST_LATENCY = Histogram("cascade:e2e_request_latency_seconds", "From request to its "
                                "last chunk (or its end).", buckets=LATENCY_BUCKETS,
                                registry=GATEWAY)


class Labelled:
    """A registry whose every sample carries ``labels`` too (vLLM's ``model_name``)."""

    def __init__(self, registry: CollectorRegistry, **labels: str) -> None:
        self.registry, self.labels = registry, labels

    def collect(self):
        for family in self.registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [s._replace(labels={**self.labels, **s.labels})
                                for s in family.samples]
            yield labelled


def serve_metrics(port: int, role: str, model_name: str, host: str = "0.0.0.0") -> None:
    """Expose the ``role``'s /metrics on its own HTTP port (drafters and verifiers have no HTTP
    server); 0: off."""
    if port:
        start_http_server(port, addr=host, registry=Labelled(REGISTRIES[role],
                                                             model_name=model_name))
