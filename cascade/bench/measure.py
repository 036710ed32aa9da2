"""What one generation recorded, and the summary of many (medians over repeats).

Definitions (as vLLM's benchmarks use them):
- time to first token (TTFT): request start to the first streamed token;
- inter-token latency (ITL): gap between successive streamed chunks (a speculative round streams
  all its tokens in one chunk, so a chunk's gap covers several tokens);
- acceptance rate: accepted / drafted tokens;
- mean acceptance length: 1 + accepted / rounds (the bonus or corrected token included);
- per-position acceptance alpha: accepted / (accepted + rounds that rejected a draft), the
  per-token probability the ideal-speedup formula assumes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from cascade.protocol.stats import SpecStats


@dataclass
class Trace:
    """One generation: when each chunk arrived and what the rounds did."""

    domain: str
    tokens: list[int] = field(default_factory=list)
    chunk_s: list[float] = field(default_factory=list)
    """Arrival of each chunk, seconds since the request started."""
    elapsed_s: float = 0.0
    stats: SpecStats = field(default_factory=SpecStats)
    """The acceptance counters of its rounds."""
    round_times: list[tuple[int, float, float]] = field(default_factory=list)
    """Per round: (drafted, draft seconds, verify seconds); the first round holds the prefills."""
    overhead_s: list[float] = field(default_factory=list)
    """Per round: round wall time minus drafting and verification compute (services only)."""

    @property
    def passes(self) -> int:
        """Target forward passes (rounds)."""
        return self.stats.num_target_passes

    @property
    def drafted(self) -> int:
        return self.stats.num_draft_tokens

    @property
    def accepted(self) -> int:
        return self.stats.num_accepted_tokens

    def chunk(self, at_s: float, tokens: list[int]) -> None:
        if tokens:
            self.tokens += tokens
            self.chunk_s.append(at_s)

    def round(self, drafted: int, accepted: int, draft_s: float = 0.0,
              verify_s: float = 0.0, emitted: int | None = None) -> None:
        """One round; it emitted ``accepted + 1`` tokens unless a limit cut it (``emitted``)."""
        self.stats.observe(drafted, accepted, accepted + 1 if emitted is None else emitted)
        self.round_times.append((drafted, draft_s, verify_s))


def fastest(candidates, trace_one, prompts, tick=None):
    """The candidate whose generations of ``prompts`` (``trace_one(candidate, prompt)``) give the
    most tokens/s; ticks after each generation."""
    def speed(candidate) -> float:
        traces = []
        for prompt in prompts:
            traces.append(trace_one(candidate, prompt))
            if tick is not None:
                tick()
        return sum(len(t.tokens) for t in traces) / sum(t.elapsed_s for t in traces)

    return max(candidates, key=speed)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Summary:
    tokens_per_s: float
    ttft_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    acceptance: float | None
    alpha: float | None
    mean_acceptance_length: float
    passes_per_token: float
    draft_ms_per_token: float | None
    verify_ms_per_pass: float
    overhead_ms: float | None
    tokens: int


def summarise(repeats: list[list[Trace]]) -> Summary:
    """Throughput: median over repeats of tokens / time; latencies and counts over all traces."""
    speeds = [sum(len(t.tokens) for t in run) / sum(t.elapsed_s for t in run) for run in repeats]
    traces = [t for run in repeats for t in run]
    gaps = [(b - a) * 1000 for t in traces for a, b in zip(t.chunk_s, t.chunk_s[1:])]
    stats = sum((t.stats for t in traces), SpecStats())
    tokens, passes = sum(len(t.tokens) for t in traces), stats.num_target_passes
    drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
    overheads = [o * 1000 for t in traces for o in t.overhead_s]
    return Summary(
        tokens_per_s=statistics.median(speeds),
        ttft_ms=statistics.median(t.chunk_s[0] * 1000 for t in traces if t.chunk_s),
        itl_p50_ms=percentile(gaps, 0.5), itl_p99_ms=percentile(gaps, 0.99),
        acceptance=accepted / drafted if drafted else None,
        alpha=stats.position_acceptance,
        mean_acceptance_length=1 + accepted / passes if passes else float("nan"),
        passes_per_token=passes / tokens if tokens else float("nan"),
        **_steady_costs(traces),
        overhead_ms=statistics.median(overheads) if overheads else None,
        tokens=tokens)


def _steady_costs(traces: list[Trace]) -> dict[str, float | None]:
    """Drafting ms per drafted token and verification ms per pass, leaving out each generation's
    first round (it also prefills the prompt, which is not a per-round cost)."""
    rounds = [r for t in traces for r in t.round_times[1:]] or \
        [r for t in traces for r in t.round_times]
    drafted = sum(r[0] for r in rounds)
    return {"draft_ms_per_token": 1000 * sum(r[1] for r in rounds) / drafted if drafted else None,
            "verify_ms_per_pass": 1000 * sum(r[2] for r in rounds) / len(rounds) if rounds
            else 0.0}


def ideal_speedup(alpha: float, k: float, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Expected tokens per round over a round's cost in target passes:
    (1 - a^(k+1)) / ((1 - a)(k c + v)), Leviathan et al. (2023) with v = 1 (verifying k + 1
    tokens costs one decoding pass, true of a memory-bound GPU). ``verify_cost`` v is the
    measured cost of a verification pass over a one-token pass, for hardware where it grows."""
    expected = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected / (k * cost_ratio + verify_cost)


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """A process's peak resident set (VmHWM) in MiB; None where /proc is missing."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def per_token_ms(runner, context: int = 128, repeats: int = 30) -> float:
    """Median milliseconds of one decoding step of ``runner`` (a model or a feature drafter)
    with ``context`` tokens cached."""
    import torch

    tokens = list(range(100, 100 + context))
    cache = runner.new_cache()
    if getattr(cache, "wants_target_features", False):  # stand-in features for the context
        cache.observe(0, torch.zeros(context, runner.drafter.fuse.in_features))
    times = []
    for _ in range(repeats):
        cache.forward_to(tokens)  # back to the context (drops the step timed before)
        started = time.perf_counter()
        cache.extend([100])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
