"""What one round did, declared once: ``RoundStats`` travels from the verifier (``Verdict.stats``)
through the drafter (``Round.stats``, its own figures added) and the gateway to the client
(``GenerateResponse.stats``, the HTTP API's ``cascade`` round extension).

A per-round statistic is added in three places: a field here, the same field of the
``RoundStats`` message (``protos/cascade/v1/common.proto``), and the code that measures it. The
wire conversions go by field name, every hop relays the whole message, and the HTTP extension
shows every field (``tests/test_protos.py`` keeps the two declarations equal).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from cascade.v1 import common_pb2

SPECULATION_NAMES = {
    common_pb2.SPECULATION_UNSPECIFIED: "lock_step",
    common_pb2.SPECULATION_MISS: "miss",
    common_pb2.SPECULATION_CACHE_HIT: "cache_hit",
    common_pb2.SPECULATION_AHEAD_HIT: "ahead_hit",
}
"""Where a round's block came from, as the HTTP API names it: drafted after the previous
verdict, the same after the drafter's guesses missed, pre-drafted and sent at the verdict,
pre-drafted and sent ahead."""


@dataclass(frozen=True)
class RoundStats:
    """What one draft-verify round did (``common.proto`` ``RoundStats``, field for field)."""

    num_accepted: int = 0
    """How many of the round's committed tokens (a prefix) were drafted and accepted."""
    num_drafted: int = 0
    """Tokens drafted and verified this round (0: the verifier decoded alone)."""
    num_deferred: int = 0
    """Cascade rules: verified drafted positions the verifier's distribution decided."""
    num_forced: int = 0
    """Structured outputs: committed tokens at positions the grammar forced."""
    num_filled: int = 0
    """The last ``num_filled`` committed tokens the verifier filled in without a pass."""
    draft_us: int = 0
    """Drafting time of the round's block (microseconds)."""
    verify_us: int = 0
    """Target pass plus acceptance on the verifier, its queueing included (microseconds)."""
    round_us: int = 0
    """The round's wall time at the drafter, previous verdict to this one (microseconds)."""
    speculation: int = 0
    """Where the block came from (``common_pb2.Speculation``; 0: drafted after the verdict)."""
    num_predrafted: int = 0
    """Blocks pre-drafted for guesses of this round's outcome while it was verified."""
    num_sent_ahead: int = 0
    """Of those, blocks sent ahead to the verifier."""
    draft_source: str = ""
    """What drafted the block (``model``, ``ngram``, ``suffix``, ``memory``, ``prediction``);
    empty when nothing was drafted."""
    num_unverified: int = 0
    """Planned sessions: drafted tokens the verifier's plan cut (drafting spent for nothing)."""

    @classmethod
    def from_pb(cls, msg: common_pb2.RoundStats) -> RoundStats:
        return cls(**{f.name: getattr(msg, f.name) for f in fields(cls)})

    def to_pb(self) -> common_pb2.RoundStats:
        return common_pb2.RoundStats(**asdict(self))

    def to_json(self) -> dict[str, Any]:
        """The HTTP API's form: times in milliseconds (``draft_ms`` ...), the block's origin by
        name."""
        out: dict[str, Any] = {}
        for name, value in asdict(self).items():
            if name.endswith("_us"):
                out[name[:-3] + "_ms"] = value / 1000
            elif name == "speculation":
                out["block"] = SPECULATION_NAMES.get(value, "lock_step")
            else:
                out[name] = value
        return out
