"""Throughput against the drafter-verifier round trip: plain (lock-step) speculative decoding
on a local cluster whose drafter's messages are delayed by each one-way delay in turn
(``--inject-delay-ms``), verifier and drafter pinned to different cores. Per delay: tokens/s,
the mean round, and the verifier's idle share of the wall time (1 - its verify time / wall):
the numbers drafting during verification (SSD) is to improve.

    python -m cascade.bench.rtt --pair smollm2 --delays 0,5,20,50
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from cascade.bench.services import pinned_cluster, place_helpers
from cascade.tools.client import stream_generation

PROMPTS = ("def fibonacci(n):", "Explain how a rainbow forms.", "import os\nimport sys\n")


@dataclass
class RttRow:
    one_way_ms: float
    tokens: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0
    verify_s: float = 0.0
    rounds: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def verifier_idle(self) -> float:
        return 1 - self.verify_s / self.wall_s if self.wall_s else 0.0

    @property
    def round_ms(self) -> float:
        return 1000 * self.wall_s / self.rounds if self.rounds else 0.0


def measure(target: Path, drafter: Path, delays: list[float], workdir: Path,
            max_tokens: int = 64, k: int = 4, prompts: tuple[str, ...] = PROMPTS
            ) -> list[RttRow]:
    rows = []
    for delay in delays:
        row = RttRow(delay)
        with pinned_cluster(target, drafter, workdir / f"delay-{delay:g}",
                            ("--inject-delay-ms", str(delay))) as (cluster, pins):
            place_helpers(cluster, pins, speculative=True)
            stream_generation(cluster.grpc_address, prompts[0], 8, k, chat=False)  # warm up
            for prompt in prompts:
                responses = []
                summary = stream_generation(cluster.grpc_address, prompt, max_tokens, k,
                                            chat=False, on_response=responses.append)
                row.tokens.append(summary.token_ids)
                row.wall_s += summary.elapsed_s
                row.verify_s += sum(r.verify_us for r in responses) / 1e6
                row.rounds += len(responses)
        rows.append(row)
    return rows


def table(rows: list[RttRow]) -> str:
    base = rows[0].tokens_per_s if rows else 0.0
    lines = ["| one-way delay ms | tokens/s | vs no delay | mean round ms | verifier idle |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.tokens_per_s / base:.2f}x" if base else "–"
        lines.append(f"| {r.one_way_ms:g} | {r.tokens_per_s:.1f} | {ratio} | "
                     f"{r.round_ms:.1f} | {100 * r.verifier_idle:.0f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from cascade.bench.run import machine
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", help="tiny or smollm2")
    parser.add_argument("--delays", default="0,5,20,50", help="One-way delays in ms.")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("runs/rtt"))
    args = parser.parse_args()
    target, drafter = default_pair(None, None, args.pair)
    delays = [float(d) for d in args.delays.split(",")]
    rows = measure(target, drafter, delays, args.workdir, args.max_tokens, args.k)
    same = all(r.tokens == rows[0].tokens for r in rows)
    print(f"Machine: {machine()}; pair: {args.pair}; k = {args.k}; {len(PROMPTS)} prompts x "
          f"{args.max_tokens} tokens, greedy; identical output at every delay: {same}.\n")
    print(table(rows))


if __name__ == "__main__":
    main()
