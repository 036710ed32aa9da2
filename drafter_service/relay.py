"""The rounds a drafter relays to the gateway: each verdict with the drafted tokens it
verified."""

from __future__ import annotations

from typing import cast

from cascade.pod.messages import round_from_verdict
from cascade.serving import metrics
from cascade.session.wire import num_verified
from cascade.v1 import common_pb2, verifier_pb2
from drafter_service.speculation import SpeculationCache


def relayed_round(verdict: verifier_pb2.Verdict, block: verifier_pb2.DraftBlock,
                  origin: int, cache: SpeculationCache | None,
                  round_us: int) -> common_pb2.Round:
    """The round of ``verdict``, which verified (a prefix of) ``block``; ``origin``: where the
    block came from, ``cache``: the pre-drafts made while it was verified (None: none)."""
    verified = block.tokens[: num_verified(verdict, block)]
    parents = block.parents[: len(verified)]
    result = round_from_verdict(verdict, verified, block.draft_us, round_us, parents,
                                block.source)
    metrics.observe_drafted(block.source, len(verified), verdict.stats.num_accepted)
    result.stats.speculation = cast(common_pb2.Speculation, origin)  # an enum value
    result.stats.num_unverified = len(block.tokens) - len(verified)
    if cache is not None:
        result.stats.num_predrafted = len(cache.blocks)
        result.stats.num_sent_ahead = len(cache.sent)
    return result
