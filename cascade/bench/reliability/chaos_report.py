"""What a chaos run records and reports (``cascade.bench.reliability.chaos``): each session's
rounds and tokens, each fault and its recovery, the run's checks (every session completed,
identical to the no-fault run, rounds 1..n) and the table per fault kind."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Session:
    prompt: int
    started: float
    rounds: list[tuple[int, float]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    ended: float = 0.0
    error: str = ""
    resumes: list[str] = field(default_factory=list)
    """The error each resume followed."""


@dataclass
class Fault:
    kind: str
    victim: str
    at: float
    recovery_s: float | None = None
    wall: float = field(default_factory=time.time)
    """When it hit (epoch seconds: to find it in the processes' logs)."""


def recovery(fault: Fault, sessions: list[Session]) -> float | None:
    """Seconds until every stream live at the fault received a round after it."""
    waits = []
    for s in sessions:
        if s.started < fault.at and (not s.ended or s.ended > fault.at):
            after = [t for _, t in s.rounds if t >= fault.at]
            if after:
                waits.append(after[0] - fault.at)
    return max(waits) if waits else None


@dataclass
class Outcome:
    sessions: list[Session]
    faults: list[Fault]
    references: dict[int, list[int]]
    errors: list[str] = field(default_factory=list)
    """The suite's own failures (a process it could not start again)."""

    def lost_and_repeated(self, session: Session) -> tuple[int, int]:
        ids = [r for r, _ in session.rounds]
        repeated = len(ids) - len(set(ids))
        lost = (max(ids) - len(set(ids))) if ids else 0
        return lost, repeated

    def summary(self) -> dict[str, int]:
        counts = [self.lost_and_repeated(s) for s in self.sessions]
        return {"sessions": len(self.sessions),
                "completed": sum(not s.error for s in self.sessions),
                "identical": sum(s.tokens == self.references[s.prompt] for s in self.sessions),
                "in order": sum([r for r, _ in s.rounds] == list(range(1, len(s.rounds) + 1))
                                for s in self.sessions),
                "rounds lost": sum(lost for lost, _ in counts),
                "rounds repeated": sum(rep for _, rep in counts),
                "faults": len(self.faults)}

    def ok(self) -> bool:
        s = self.summary()
        return (s["completed"] == s["identical"] == s["in order"] == s["sessions"]
                and s["rounds lost"] == s["rounds repeated"] == 0 and not self.errors)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(outcome: Outcome) -> str:
    """The summary line and, per fault kind: count and recovery p50 / p99 / max (markdown)."""
    s = outcome.summary()
    lines = [", ".join(f"{k}: {v}" for k, v in s.items()) + "\n",
             "| fault | count | recovery p50 s | recovery p99 s | recovery max s |",
             "|---|---|---|---|---|"]
    for kind in sorted({f.kind for f in outcome.faults}):
        times = [f.recovery_s for f in outcome.faults if f.kind == kind
                 and f.recovery_s is not None]
        cells = ([f"{statistics.median(times):.2f}", f"{_quantile(times, 0.99):.2f}",
                  f"{max(times):.2f}"] if times else ["–"] * 3)
        count = sum(f.kind == kind for f in outcome.faults)
        lines.append(f"| {kind} | {count} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
