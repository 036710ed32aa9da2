"""Per-position acceptance estimates: how likely each drafted position is to be accepted.

A round that verified n drafted tokens and accepted a of them observed positions 1 .. min(a + 1,
n): the first a accepted, position a + 1 (if verified) rejected; later positions were not
reached. Survival S_i, the chance that position i is reached *and* accepted, is the running
product of the positions' conditional acceptance rates (accepted given reached).

A token tree's nodes are slots too: node i (nodes come best first) survives when it lies on the
accepted path. Its rate is estimated directly (``NodeRates``: on the path or not, for every node
verified), and its survival is the running minimum of those rates, so survival never rises along
a block and any prefix of it is worth its sum.

The pooled estimate of a drafting method (every session of it on this verifier) is a slow
moving average. A session's own rate is a Beta-style mean that starts at the pooled rate with
the weight of ``PRIOR_ROUNDS`` observations and counts its own observations with forgetting
(``SESSION_DECAY`` per observation): one lucky round moves it a little, a run of them a lot, and
an old run fades.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cascade.protocol.settings import MAX_DRAFT_TOKENS, MAX_TREE_NODES

PRIOR = 0.5
"""Conditional acceptance before anything was observed (the pooled estimate takes over fast)."""
PRIOR_ROUNDS = 6.0
"""How many of its own observations a session's rate needs to weigh as much as the pooled one."""
SESSION_DECAY = 0.9
"""Weight an earlier observation of a session keeps at each new one of the same position."""
POOLED_WEIGHT = 0.05
"""Weight of one observation in the pooled (per-method) moving average."""


@dataclass
class AcceptanceRates:
    """Moving averages of the conditional acceptance rate of positions 1 .. MAX_DRAFT_TOKENS."""

    weight: float
    rates: list[float] = field(default_factory=lambda: [PRIOR] * MAX_DRAFT_TOKENS)
    num_rounds: int = 0

    def observe(self, num_verified: int, num_accepted: int) -> None:
        """One round: ``num_verified`` drafted tokens were verified, ``num_accepted`` kept."""
        if num_verified <= 0:
            return
        self.num_rounds += 1
        for position in range(min(num_accepted + 1, num_verified)):
            hit = 1.0 if position < num_accepted else 0.0
            self.rates[position] += self.weight * (hit - self.rates[position])

    def survival(self, length: int) -> list[float]:
        """S_1 .. S_length."""
        return _running_product(self.rates[:length])


@dataclass
class SessionRates:
    """A session's rates: its own decayed counts on top of its method's pooled rates."""

    pooled: AcceptanceRates
    hits: list[float] = field(default_factory=lambda: [0.0] * MAX_DRAFT_TOKENS)
    trials: list[float] = field(default_factory=lambda: [0.0] * MAX_DRAFT_TOKENS)

    def observe(self, num_verified: int, num_accepted: int) -> None:
        for position in range(min(num_accepted + 1, num_verified)):
            self.hits[position] = SESSION_DECAY * self.hits[position] + (
                position < num_accepted)
            self.trials[position] = SESSION_DECAY * self.trials[position] + 1.0

    def survival(self, length: int) -> list[float]:
        rates = [(PRIOR_ROUNDS * prior + hits) / (PRIOR_ROUNDS + trials) for prior, hits, trials
                 in zip(self.pooled.rates[:length], self.hits, self.trials)]
        return _running_product(rates)


def node_prior(index: int) -> float:
    """The chance node ``index`` of a tree is on the accepted path before anything was seen."""
    return PRIOR / (1 + index)


@dataclass
class NodeRates:
    """Moving averages of the chance that tree node i is on the accepted path."""

    weight: float
    rates: list[float] = field(default_factory=lambda: [node_prior(i)
                                                        for i in range(MAX_TREE_NODES)])

    def observe(self, num_verified: int, path: Sequence[int]) -> None:
        on_path = set(path)
        for i in range(min(num_verified, MAX_TREE_NODES)):
            self.rates[i] += self.weight * ((i in on_path) - self.rates[i])

    def survival(self, length: int) -> list[float]:
        return _running_min(self.rates[:length])


@dataclass
class SessionNodeRates:
    """A tree session's node rates: its own decayed counts on top of the pooled ones."""

    pooled: NodeRates
    hits: list[float] = field(default_factory=lambda: [0.0] * MAX_TREE_NODES)
    trials: list[float] = field(default_factory=lambda: [0.0] * MAX_TREE_NODES)

    def observe(self, num_verified: int, path: Sequence[int]) -> None:
        on_path = set(path)
        for i in range(min(num_verified, MAX_TREE_NODES)):
            self.hits[i] = SESSION_DECAY * self.hits[i] + (i in on_path)
            self.trials[i] = SESSION_DECAY * self.trials[i] + 1.0

    def survival(self, length: int) -> list[float]:
        rates = [(PRIOR_ROUNDS * prior + hits) / (PRIOR_ROUNDS + trials) for prior, hits, trials
                 in zip(self.pooled.rates[:length], self.hits, self.trials)]
        return _running_min(rates)


def _running_min(rates: list[float]) -> list[float]:
    out, low = [], 1.0
    for rate in rates:
        low = min(low, rate)
        out.append(low)
    return out


def _running_product(rates: list[float]) -> list[float]:
    out, alive = [], 1.0
    for rate in rates:
        alive *= rate
        out.append(alive)
    return out


class SurvivalBook:
    """The pooled estimate per drafting method, and each session's own (keyed by any id)."""

    def __init__(self) -> None:
        self.pooled: dict[str, AcceptanceRates] = {}
        self.sessions: dict[object, SessionRates] = {}
        self.pooled_nodes: dict[str, NodeRates] = {}
        self.tree_sessions: dict[object, SessionNodeRates] = {}

    def of(self, key: object, method: str) -> SessionRates:
        """The session's estimate (started from its method's pooled one)."""
        if key not in self.sessions:
            pooled = self.pooled.setdefault(method, AcceptanceRates(POOLED_WEIGHT))
            self.sessions[key] = SessionRates(pooled)
        return self.sessions[key]

    def observe(self, key: object, method: str, num_verified: int, num_accepted: int) -> None:
        self.of(key, method).observe(num_verified, num_accepted)
        self.pooled[method].observe(num_verified, num_accepted)

    def of_tree(self, key: object, method: str) -> SessionNodeRates:
        """A tree session's node estimate (started from its method's pooled one)."""
        if key not in self.tree_sessions:
            pooled = self.pooled_nodes.setdefault(method, NodeRates(POOLED_WEIGHT))
            self.tree_sessions[key] = SessionNodeRates(pooled)
        return self.tree_sessions[key]

    def observe_tree(self, key: object, method: str, num_verified: int,
                     path: Sequence[int]) -> None:
        self.of_tree(key, method).observe(num_verified, path)
        self.pooled_nodes[method].observe(num_verified, path)

    def forget(self, key: object) -> None:
        self.sessions.pop(key, None)
        self.tree_sessions.pop(key, None)
