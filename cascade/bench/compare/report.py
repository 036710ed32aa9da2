"""Turn the methods' traces into rows: throughput against each method's own target-only
baseline, latencies, acceptance, the ideal speedup the measured acceptance and cost allow."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from cascade.bench.compare.inprocess import MethodRun
from cascade.bench.measure import Summary, ideal_speedup, summarise

@dataclass
class Row:
    method: str
    family: str
    mode: str
    note: str
    summary: Summary
    per_domain_tokens_per_s: dict[str, float]
    mean_draft_len: float
    cost_ratio: float | None
    speedup: float
    ideal: float | None
    """(1 - a^(k+1)) / ((1 - a)(k c + 1)) from the measured a, mean block k and cost ratio c."""
    verify_cost: float | None
    """v: a verification pass's time over a target-only pass's (1 on a memory-bound GPU)."""
    ideal_measured: float | None
    """The same expectation over k c + v: what the measured costs allow."""
    peak_rss_mb: str
    """Peak resident memory of the process(es) that ran it, MiB."""
    same_output: bool | None
    """Greedy: every generation equals the target-only greedy one (the core loop's k = 0
    run when it ran, else the family's own baseline)."""

    @property
    def of_ideal(self) -> float | None:
        return self.speedup / self.ideal if self.ideal else None

    @property
    def of_ideal_measured(self) -> float | None:
        return self.speedup / self.ideal_measured if self.ideal_measured else None

    def as_dict(self) -> dict:
        return asdict(self) | {"of_ideal": self.of_ideal,
                               "of_ideal_measured": self.of_ideal_measured}


@dataclass(frozen=True)
class Costs:
    """Per-token drafter and per-pass target cost (ms) a family's ideal speedup uses."""

    drafter_ms: float | None
    target_ms: float

    @property
    def ratio(self) -> float | None:
        return self.drafter_ms / self.target_ms if self.drafter_ms and self.target_ms else None


def _domains(method: MethodRun) -> dict[str, float]:
    names = dict.fromkeys(t.domain for t in method.runs[0])
    return {d: summarise([[t for t in run if t.domain == d] for run in method.runs]).tokens_per_s
            for d in names}


def build_rows(methods: list[MethodRun], costs: dict[str, Costs], rss: dict[str, str],
               temperature: float) -> list[Row]:
    """Each family's speedups are over its own target-only run (its method with k = 0)."""
    baselines = {m.family: m for m in methods if m.k == 0}
    return [_row(m, baselines, costs[m.family], rss.get(m.family, "–"), temperature)
            for m in methods]


def _row(m: MethodRun, baselines: dict[str, MethodRun], costs: Costs, rss: str,
         temperature: float) -> Row:
    summary = summarise(m.runs)
    base = summarise(baselines[m.family].runs)
    rounds = sum(t.passes for run in m.runs for t in run)
    drafted = sum(t.drafted for run in m.runs for t in run)
    k_mean = drafted / rounds if rounds else 0.0
    ideal = ideal_measured = verify_cost = None
    if summary.alpha is not None and costs.ratio is not None and k_mean:
        ideal = ideal_speedup(summary.alpha, k_mean, costs.ratio)
        if summary.verify_ms_per_pass and base.verify_ms_per_pass:
            verify_cost = summary.verify_ms_per_pass / base.verify_ms_per_pass
            ideal_measured = ideal_speedup(summary.alpha, k_mean, costs.ratio, verify_cost)
    same = None
    # Every method here runs the default, lossless policy (greedy rows: the greedy rule), so its
    # greedy output must equal target-only decoding; a lossy rule would need a quality column.
    if not m.sampling:  # against the core's target-only run when there is one
        reference = baselines.get("core", baselines[m.family])
        same = [t.tokens for t in m.runs[0]] == [t.tokens for t in reference.runs[0]]
    return Row(method=m.name, family=m.family,
               mode=f"T={temperature:g}" if m.sampling else "greedy", note=m.note,
               summary=summary, per_domain_tokens_per_s=_domains(m), mean_draft_len=k_mean,
               cost_ratio=costs.ratio if drafted else None,
               speedup=summary.tokens_per_s / base.tokens_per_s, ideal=ideal,
               verify_cost=verify_cost, ideal_measured=ideal_measured, peak_rss_mb=rss,
               same_output=same)


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


COLUMNS = ("method", "mode", "tokens/s", "speedup", "TTFT ms", "ITL p50 ms", "ITL p99 ms",
           "acceptance", "mean acc. len", "passes/token", "ideal", "of ideal", "v",
           "ideal (v)", "of ideal (v)",
           "overhead ms/round", "peak RSS MiB", "same as greedy")


def row_cells(row: Row) -> list[str]:
    s = row.summary
    return [row.method + (f" [{row.note}]" if row.note else ""), row.mode,
            _fmt(s.tokens_per_s, ".1f"), _fmt(row.speedup, ".2f", "x"), _fmt(s.ttft_ms, ".0f"),
            _fmt(s.itl_p50_ms, ".1f"), _fmt(s.itl_p99_ms, ".1f"), _fmt(s.acceptance, ".3f"),
            _fmt(s.mean_acceptance_length), _fmt(s.passes_per_token, ".3f"),
            _fmt(row.ideal, ".2f", "x"), _fmt(row.of_ideal, ".0%"), _fmt(row.verify_cost),
            _fmt(row.ideal_measured, ".2f", "x"), _fmt(row.of_ideal_measured, ".0%"),
            _fmt(s.overhead_ms),
            row.peak_rss_mb,
            "–" if row.same_output is None else ("yes" if row.same_output else "NO")]


def markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def goals(rows: list[Row]) -> list[tuple[str, str, str]]:
    """(goal, target, measured) for the headline comparisons (greedy) that this run measured."""
    greedy = {(r.family, r.method): r for r in rows if r.mode == "greedy"}
    services = next((r for (f, _), r in greedy.items() if f == "services" and r.ideal), None)
    hf = greedy.get(("hf", "HF assisted, best"))
    if services is None:
        return []
    found = []
    if hf is not None:
        found.append(("services vs HF assisted (best), tokens/s", ">= 1.3x",
                      _fmt(services.summary.tokens_per_s / hf.summary.tokens_per_s, ".2f", "x")))
    return found + [
        ("services vs target-only (verifier)", ">= 2.5x (as acceptance allows)",
         _fmt(services.speedup, ".2f", "x")),
        ("services, measured / ideal speedup", ">= 90%", _fmt(services.of_ideal, ".0%")),
        ("services, measured / ideal with the measured verify cost v", "(explains the gap)",
         _fmt(services.of_ideal_measured, ".0%")),
        ("protocol overhead per round (median)", "<= 1 ms",
         _fmt(services.summary.overhead_ms, ".2f", " ms")),
    ]
