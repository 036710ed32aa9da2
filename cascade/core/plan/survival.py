"""Per-position acceptance estimates: how likely each drafted position is to be accepted.

A round that verified n drafted tokens and accepted a of them observed positions 1 .. min(a + 1,
n): the first a accepted, position a + 1 (if verified) rejected; later positions were not
reached. Survival S_i, the chance that position i is reached *and* accepted, is the running
product of the positions' conditional acceptance rates (accepted given reached).

A token tree's nodes are slots too: node i (nodes come best first) survives when it lies on the
accepted path. Its rate is estimated directly (``node_rates``: on the path or not, for every node
verified), and its survival is the running minimum of those rates, so survival never rises along
a block and any prefix of it is worth its sum.

The pooled estimate of a drafting method (every session of it on this verifier) is a slow
moving average. A session's own rate is a Beta-style mean that starts at the pooled rate with
the weight of ``PRIOR_ROUNDS`` observations and counts its own observations with forgetting
(``SESSION_DECAY`` per observation): one lucky round moves it a little, a run of them a lot, and
an old run fades.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cascade.protocol.limits import MAX_DRAFT_TOKENS, MAX_TREE_NODES

PRIOR = 0.5
"""Conditional acceptance before anything was observed (the pooled estimate takes over fast)."""
PRIOR_ROUNDS = 6.0
"""How many of its own observations a session's rate needs to weigh as much as the pooled one."""
SESSION_DECAY = 0.9
"""Weight an earlier observation of a session keeps at each new one of the same position."""
POOLED_WEIGHT = 0.05
"""Weight of one observation in the pooled (per-method) moving average."""


Slots = list[tuple[int, bool]]
"""What one round observed: (slot index, accepted) for every slot it reached."""


def chain_slots(num_verified: int, num_accepted: int) -> Slots:
    """A chain's round: positions 1 .. min(a + 1, n) reached, the first a accepted."""
    return [(i, i < num_accepted) for i in range(min(num_accepted + 1, num_verified))]


def tree_slots(num_verified: int, path: Sequence[int]) -> Slots:
    """A tree's round: every verified node observed, accepted when it lies on the path."""
    on_path = set(path)
    return [(i, i in on_path) for i in range(min(num_verified, MAX_TREE_NODES))]


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


@dataclass
class AcceptanceRates:
    """Moving averages of each slot's rate: by default a chain's conditional acceptance rate of
    positions 1 .. MAX_DRAFT_TOKENS (survival: their running product); ``node_rates`` makes
    the per-node variant of trees."""

    weight: float
    rates: list[float] = field(default_factory=lambda: [PRIOR] * MAX_DRAFT_TOKENS)
    num_rounds: int = 0
    combine: Callable[[list[float]], list[float]] = _running_product
    """Rates -> survival: running product (chains) or running minimum (tree nodes)."""

    def observe(self, num_verified: int, num_accepted: int) -> None:
        """One round: ``num_verified`` drafted tokens were verified, ``num_accepted`` kept."""
        if num_verified <= 0:
            return
        self.num_rounds += 1
        self.update(chain_slots(num_verified, num_accepted))

    def update(self, slots: Slots) -> None:
        for i, hit in slots:
            self.rates[i] += self.weight * (hit - self.rates[i])

    def survival(self, length: int) -> list[float]:
        """S_1 .. S_length."""
        return self.combine(self.rates[:length])


def node_prior(index: int) -> float:
    """The chance node ``index`` of a tree is on the accepted path before anything was seen."""
    return PRIOR / (1 + index)


def node_rates(weight: float) -> AcceptanceRates:
    """Moving averages of the chance that tree node i is on the accepted path."""
    return AcceptanceRates(weight, [node_prior(i) for i in range(MAX_TREE_NODES)],
                           combine=_running_min)


@dataclass
class SessionRates:
    """A session's rates: its own decayed counts on top of its method's pooled rates (chain
    positions or tree nodes, as the pooled rates are)."""

    pooled: AcceptanceRates
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hits = self.hits or [0.0] * len(self.pooled.rates)
        self.trials = self.trials or [0.0] * len(self.pooled.rates)

    def observe(self, num_verified: int, num_accepted: int) -> None:
        self.update(chain_slots(num_verified, num_accepted))

    def update(self, slots: Slots) -> None:
        for i, hit in slots:
            self.hits[i] = SESSION_DECAY * self.hits[i] + hit
            self.trials[i] = SESSION_DECAY * self.trials[i] + 1.0

    def survival(self, length: int) -> list[float]:
        rates = [(PRIOR_ROUNDS * prior + hits) / (PRIOR_ROUNDS + trials) for prior, hits, trials
                 in zip(self.pooled.rates[:length], self.hits, self.trials)]
        return self.pooled.combine(rates)


class SurvivalBook:
    """The pooled estimate per drafting method, and each session's own (keyed by any id)."""

    def __init__(self) -> None:
        self.pooled: dict[str, AcceptanceRates] = {}
        self.sessions: dict[object, SessionRates] = {}
        self.pooled_nodes: dict[str, AcceptanceRates] = {}
        self.tree_sessions: dict[object, SessionRates] = {}

    def of(self, key: object, method: str) -> SessionRates:
        """The session's estimate (started from its method's pooled one)."""
        if key not in self.sessions:
            pooled = self.pooled.setdefault(method, AcceptanceRates(POOLED_WEIGHT))
            self.sessions[key] = SessionRates(pooled)
        return self.sessions[key]

    def observe(self, key: object, method: str, num_verified: int, num_accepted: int) -> None:
        self.of(key, method).observe(num_verified, num_accepted)
        self.pooled[method].observe(num_verified, num_accepted)

    def of_tree(self, key: object, method: str) -> SessionRates:
        """A tree session's node estimate (started from its method's pooled one)."""
        if key not in self.tree_sessions:
            if method not in self.pooled_nodes:
                self.pooled_nodes[method] = node_rates(POOLED_WEIGHT)
            self.tree_sessions[key] = SessionRates(self.pooled_nodes[method])
        return self.tree_sessions[key]

    def observe_tree(self, key: object, method: str, num_verified: int,
                     path: Sequence[int]) -> None:
        slots = tree_slots(num_verified, path)
        self.of_tree(key, method).update(slots)
        self.pooled_nodes[method].update(slots)

    def forget(self, key: object) -> None:
        self.sessions.pop(key, None)
        self.tree_sessions.pop(key, None)
