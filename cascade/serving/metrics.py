"""Prometheus metrics, with vLLM's names for speculative decoding under the ``cascade:`` prefix.

Counters are exposed with a ``_total`` suffix. Definitions (as vLLM's):
acceptance rate = rate(cascade:spec_decode_num_accepted_tokens_total)
                  / rate(cascade:spec_decode_num_draft_tokens_total);
mean acceptance length = 1 + rate(accepted tokens) / rate(cascade:spec_decode_num_drafts_total)
(the bonus token included).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                   0.75, 1.0, 2.5, 5.0, 10.0, 30.0)

# Verifier: every verified block.
NUM_DRAFTS = Counter("cascade:spec_decode_num_drafts", "Rounds that verified >= 1 drafted token.")
NUM_DRAFT_TOKENS = Counter("cascade:spec_decode_num_draft_tokens", "Drafted tokens verified.")
NUM_ACCEPTED_TOKENS = Counter("cascade:spec_decode_num_accepted_tokens", "Drafted tokens accepted.")
ACCEPTED_PER_POS = Counter("cascade:spec_decode_num_accepted_tokens_per_pos",
                           "Accepted drafted tokens by position in the block (0-based).",
                           ["position"])
VERIFIER_QUEUE_DEPTH = Gauge("cascade:verifier_queue_depth",
                             "Blocks waiting for or in the verifier's target model.")
VERIFIER_SESSIONS = Gauge("cascade:verifier_active_sessions", "Sessions open on the verifier.")
VERIFY_SECONDS = Histogram("cascade:verify_seconds", "Target pass plus acceptance per block.",
                           buckets=LATENCY_BUCKETS)
# Drafter.
DRAFTER_SESSIONS = Gauge("cascade:drafter_active_sessions", "Sessions running on the drafter.")
DRAFT_SECONDS = Histogram("cascade:draft_seconds", "Drafting time per block.",
                          buckets=LATENCY_BUCKETS)
# Gateway.
REQUESTS_RUNNING = Gauge("cascade:num_requests_running", "Generations in progress.")
REQUESTS_FINISHED = Counter("cascade:request_success", "Generations finished.", ["finish_reason"])
PROMPT_TOKENS = Counter("cascade:prompt_tokens", "Prompt tokens of admitted requests.")
GENERATION_TOKENS = Counter("cascade:generation_tokens", "Tokens generated and sent.")
TIME_TO_FIRST_TOKEN = Histogram("cascade:time_to_first_token_seconds",
                                "From request to the first committed chunk.",
                                buckets=LATENCY_BUCKETS)
INTER_TOKEN_LATENCY = Histogram("cascade:inter_token_latency_seconds",
                                "Between consecutive committed tokens (a chunk's gap spread "
                                "over its tokens).", buckets=LATENCY_BUCKETS)


def observe_block(num_draft: int, num_accepted: int) -> None:
    if num_draft == 0:
        return
    NUM_DRAFTS.inc()
    NUM_DRAFT_TOKENS.inc(num_draft)
    NUM_ACCEPTED_TOKENS.inc(num_accepted)
    for position in range(num_accepted):
        ACCEPTED_PER_POS.labels(position=str(position)).inc()


def serve_metrics(port: int, host: str = "0.0.0.0") -> None:
    """Expose /metrics on its own HTTP port (the drafter and verifier have no HTTP server)."""
    if port:
        start_http_server(port, addr=host)
