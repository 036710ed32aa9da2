"""Throughput against the drafter-verifier round trip, with and without drafting during
verification: a local cluster whose drafter's messages are delayed by each one-way delay in turn
(``--inject-delay-ms``), verifier and drafter pinned to different cores (the gateway, Redis and
the client on the core that would otherwise wait), for each speculation
mode (``--speculate off``: lock-step; ``cache``: pre-drafts for guessed outcomes; ``ahead``: and
the best ones sent ahead). Requests use ``draft_schedule: fixed`` (every round drafts k: the
benchmark measures the link, not the planner, which would stop drafting over a slow link).
Per (mode, delay): tokens/s, the mean round, the verifier's idle share
of the wall time (1 - its verify time / wall), and where the rounds' blocks came from.
``--tree-nodes`` drafts token trees instead of chains (depth k).

    python -m cascade.bench.rtt --pair smollm2 --delays 0,5,20,50 --modes off,cache,ahead
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cascade.bench.services import pinned_cluster, place_helpers
from cascade.tools.client import stream_generation
from cascade.v1 import common_pb2

PROMPTS = ("def fibonacci(n):", "Explain how a rainbow forms.", "import os\nimport sys\n")
MODES = ("off", "cache", "ahead")


@dataclass
class RttRow:
    one_way_ms: float
    mode: str = "off"
    tokens: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0
    verify_s: float = 0.0
    rounds: int = 0
    origins: Counter = field(default_factory=Counter)
    """Rounds after each session's first, by where their block came from."""

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

    def share(self, *origins: int) -> float:
        total = sum(self.origins.values())
        return sum(self.origins[o] for o in origins) / total if total else 0.0


def _speculation_args(mode: str, delay: float, extra: tuple[str, ...]) -> tuple[str, ...]:
    return ("--inject-delay-ms", str(delay), "--speculate", mode,
            *(extra if mode != "off" else ()))


def measure(target: Path, drafter: Path, delays: list[float], workdir: Path,
            max_tokens: int = 64, k: int = 4, prompts: tuple[str, ...] = PROMPTS,
            modes: tuple[str, ...] = ("off",), drafter_args: tuple[str, ...] = (),
            repeats: int = 1, tree_nodes: int = 0, tree_expansion: str = "") -> list[RttRow]:
    """One row per (mode, delay), in that order. Modes take turns at each delay, in reverse
    order on every other repeat, so a slow drift of the machine's speed does not favour one
    of them. ``drafter_args``: more drafter flags for the speculating modes (--send-ahead 3);
    ``tree_nodes``: token trees of that many nodes (0: chains), grown by ``tree_expansion``."""
    shape = {"tree_nodes": tree_nodes or None, "tree_expansion": tree_expansion}
    rows = {(mode, delay): RttRow(delay, mode) for mode in modes for delay in delays}
    for repeat in range(repeats):
        for delay in delays:
            for mode in modes if repeat % 2 == 0 else modes[::-1]:
                with pinned_cluster(target, drafter, workdir / f"{mode}-{delay:g}-{repeat}",
                                    _speculation_args(mode, delay, drafter_args)
                                    ) as (cluster, pins):
                    # gateway, Redis and client go on the core that waits: the verifier's
                    # while a lock-step drafter drafts, the drafter's when it pre-drafts
                    place_helpers(cluster, pins, verifier_waits=mode == "off")
                    stream_generation(cluster.grpc_address, prompts[0], 8, k, chat=False,
                                      schedule="fixed", **shape)
                    _run_prompts(cluster.grpc_address, rows[mode, delay], prompts, max_tokens,
                                 k, shape)
    return list(rows.values())


def _run_prompts(address: str, row: RttRow, prompts: tuple[str, ...], max_tokens: int,
                 k: int, shape: dict) -> RttRow:
    for prompt in prompts:
        responses = []
        summary = stream_generation(address, prompt, max_tokens, k, chat=False,
                                    on_response=responses.append, schedule="fixed", **shape)
        row.tokens.append(summary.token_ids)
        row.wall_s += summary.elapsed_s
        row.verify_s += sum(r.stats.verify_us for r in responses) / 1e6
        row.rounds += len(responses)
        row.origins.update(r.stats.speculation for r in responses[1:])
    return row


def table(rows: list[RttRow]) -> str:
    """One line per (mode, delay); ratios against lock-step at the same delay and at 0 ms."""
    off = {r.one_way_ms: r.tokens_per_s for r in rows if r.mode == "off"}
    lines = ["| speculation | one-way delay ms | tokens/s | vs off, same delay | vs off, 0 ms "
             "| mean round ms | verifier idle | cache hits | sent-ahead hits |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same, zero = off.get(r.one_way_ms), off.get(0.0)
        lines.append(
            f"| {r.mode} | {r.one_way_ms:g} | {r.tokens_per_s:.1f} | {_ratio(r, same)} | "
            f"{_ratio(r, zero)} | {r.round_ms:.1f} | {100 * r.verifier_idle:.0f} % | "
            f"{_percent(r, common_pb2.SPECULATION_CACHE_HIT)} | "
            f"{_percent(r, common_pb2.SPECULATION_AHEAD_HIT)} |")
    return "\n".join(lines) + "\n"


def _ratio(row: RttRow, base: float | None) -> str:
    return f"{row.tokens_per_s / base:.2f}x" if base else "–"


def _percent(row: RttRow, origin: int) -> str:
    return f"{100 * row.share(origin):.0f} %" if row.mode != "off" else "–"


def recovered(rows: list[RttRow], delay: float, mode: str) -> float | None:
    """The share of the throughput the round trip costs lock-step decoding at ``delay`` that
    ``mode`` wins back: (mode - off) / (off at 0 ms - off)."""
    by = {(r.mode, r.one_way_ms): r.tokens_per_s for r in rows}
    base, near, far = by.get(("off", 0.0)), by.get(("off", delay)), by.get((mode, delay))
    if None in (base, near, far) or base <= near:
        return None
    return (far - near) / (base - near)


def plot(rows: list[RttRow], path: Path, title: str) -> Path:
    """Tokens/s against the injected round trip (twice the one-way delay), a line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode in dict.fromkeys(r.mode for r in rows):
        line = [r for r in rows if r.mode == mode]
        ax.plot([2 * r.one_way_ms for r in line], [r.tokens_per_s for r in line], marker="o",
                label=f"speculation {mode}")
    ax.set_xlabel("injected round-trip time (ms)")
    ax.set_ylabel("tokens/s")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    from cascade.bench.run import machine
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", help="tiny or smollm2")
    parser.add_argument("--delays", default="0,5,20,50", help="One-way delays in ms.")
    parser.add_argument("--modes", default="off,cache,ahead", help="Speculation modes.")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="Passes over every (mode, "
                        "delay); modes take turns in reverse order on every other pass.")
    parser.add_argument("--workdir", type=Path, default=Path("runs/rtt"))
    parser.add_argument("--drafter-args", default="", help="More drafter flags for the "
                        "speculating modes, e.g. '--send-ahead 3 --speculate-fanout 2'.")
    parser.add_argument("--plot", type=Path, help="Write the PNG here.")
    parser.add_argument("--tree-nodes", type=int, default=0, help="Draft token trees of this "
                        "many nodes, depth k (0: chains).")
    parser.add_argument("--tree-expansion", default="", help="dynamic (default) or confidence.")
    args = parser.parse_args()
    target, drafter = default_pair(None, None, args.pair)
    delays = [float(d) for d in args.delays.split(",")]
    rows = measure(target, drafter, delays, args.workdir, args.max_tokens, args.k,
                   modes=tuple(args.modes.split(",")),
                   drafter_args=tuple(args.drafter_args.split()), repeats=args.repeats,
                   tree_nodes=args.tree_nodes, tree_expansion=args.tree_expansion)
    same = all(r.tokens == rows[0].tokens for r in rows)
    shape = f"trees of {args.tree_nodes} nodes" if args.tree_nodes else "chains"
    print(f"Machine: {machine()}; pair: {args.pair}; k = {args.k}, {shape}; {len(PROMPTS)} "
          f"prompts x {args.max_tokens} tokens x {args.repeats} passes, greedy; identical "
          f"output in every row: {same}.\n")
    print(table(rows))
    for mode in dict.fromkeys(r.mode for r in rows if r.mode != "off"):
        for delay in delays[1:]:
            share = recovered(rows, delay, mode)
            if share is not None:
                print(f"{mode} at {delay:g} ms one way recovers {100 * share:.0f} % of what the "
                      f"round trip costs lock-step decoding.")
    if args.plot:
        plot(rows, args.plot, f"Throughput vs round trip ({args.pair}, k = {args.k})")


if __name__ == "__main__":
    main()
