"""How fast the speculation memory answers, and what it holds, at a given number of indexed
sequences: indexing rate, lookup time (candidates for a context's suffix) and scoring time
(the best draft from them), p50 and p99, and the process's peak RSS.

The sequences are synthetic: each is four 16-token phrases drawn from a pool of 2,000 (so
places repeat across sequences, as tool calls and boilerplate do) plus 16 random tokens, in 10
scopes. Each lookup's context is 50 random tokens followed by the start of an indexed sequence
of its scope (a real match).

    cascade bench suffix-lookup [--sequences 1000 --sequences 100000] [--lookups 2000]
"""

from __future__ import annotations

import resource
import time

import numpy as np
from pydantic import BaseModel, Field, field_validator
from rich.console import Console
from rich.table import Table

from cascade.bench.compare.run import machine
from cascade.core.memory.suffix_draft import best_draft
from cascade.core.memory.suffix_index import SuffixIndex
from cascade.core.memory.candidates import MemoryLimits
from cascade.serving.settings_cli import settings_command

VOCAB = 32_000
SCOPES = 10


def build(num_sequences: int, seed: int = 0) -> tuple[SuffixIndex, list[list[int]], float]:
    """(index, its sequences, seconds spent indexing them)."""
    rng = np.random.default_rng(seed)
    phrases = rng.integers(0, VOCAB, size=(2000, 16))
    sequences = [np.concatenate([phrases[rng.integers(0, 2000, 4)].reshape(-1),
                                 rng.integers(0, VOCAB, 16)]).tolist()
                 for _ in range(num_sequences)]
    index = SuffixIndex(MemoryLimits(max_sequences=num_sequences))
    started = time.perf_counter()
    for i, sequence in enumerate(sequences):
        index.add(sequence, f"scope-{i % SCOPES}")
    return index, sequences, time.perf_counter() - started


def measure(index: SuffixIndex, sequences: list[list[int]], num_lookups: int, budget: int = 16,
            seed: int = 1) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    lookups, drafts, hits = [], [], 0
    for _ in range(num_lookups):
        i = int(rng.integers(0, len(sequences)))
        context = rng.integers(0, VOCAB, 50).tolist() + sequences[i][:int(rng.integers(8, 60))]
        started = time.perf_counter()
        found = index.candidates(context, f"scope-{i % SCOPES}")
        looked_up = time.perf_counter()
        draft = best_draft(found, budget)
        drafts.append(time.perf_counter() - looked_up)
        lookups.append(looked_up - started)
        hits += bool(draft.tokens)
    ms = lambda xs, q: float(np.percentile(xs, q) * 1e3)  # noqa: E731
    return {"lookup_p50_ms": ms(lookups, 50), "lookup_p99_ms": ms(lookups, 99),
            "draft_p50_ms": ms(drafts, 50), "draft_p99_ms": ms(drafts, 99),
            "hit_rate": hits / num_lookups}


class SuffixLookupSettings(BaseModel):
    """How fast the speculation memory indexes, looks up and drafts, and its peak RSS, at each
    number of indexed (synthetic) sequences."""

    sequences: list[int] = Field([1_000, 10_000, 100_000], description="Indexed sequences, a "
                                 "row each (repeat the flag).")
    lookups: int = Field(2000, ge=1, description="Lookups timed per row.")

    @field_validator("sequences")
    @classmethod
    def _positive(cls, sequences: list[int]) -> list[int]:
        if any(n < 1 for n in sequences):
            raise ValueError("every count must be at least 1")
        return sequences


def run(settings: SuffixLookupSettings) -> None:
    """Build an index of each size, time its lookups and print the table."""
    out = Table(title=f"Speculation memory lookups ({machine()})")
    for column in ("sequences", "tokens", "index seq/s", "lookup p50 / p99 ms",
                   "draft p50 / p99 ms", "hit rate", "peak RSS MB"):
        out.add_column(column, justify="right")
    for num in settings.sequences:
        index, sequences, seconds = build(num)
        index.merge()
        r = measure(index, sequences, settings.lookups)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out.add_row(f"{index.num_sequences:,}", f"{index.num_tokens:,}", f"{num / seconds:,.0f}",
                    f"{r['lookup_p50_ms']:.3f} / {r['lookup_p99_ms']:.3f}",
                    f"{r['draft_p50_ms']:.3f} / {r['draft_p99_ms']:.3f}", f"{r['hit_rate']:.2f}",
                    f"{rss:,.0f}")
    Console(width=140).print(out)


if __name__ == "__main__":
    settings_command(SuffixLookupSettings, run)()
