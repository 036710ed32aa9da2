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

    cascade bench rtt --pair smollm2 --delays 0 --delays 20 --modes off --modes ahead
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from cascade.bench.compare.services import pinned_cluster, place_helpers
from cascade.serving.settings_cli import settings_command
from cascade.tools.client import stream_generation
from cascade.tools.pairs import PairSettings
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


class RttSettings(BaseModel):
    """Throughput against the drafter-verifier round trip, per speculation mode and one-way
    delay (a row each; greedy, identical tokens in every row)."""

    models: PairSettings = PairSettings()
    delays: list[float] = Field([0.0, 5.0, 20.0, 50.0], description="One-way delays in ms "
                                "(repeat the flag).")
    modes: list[Literal["off", "cache", "ahead"]] = Field(
        list(MODES), description="Speculation modes (repeat the flag): off, cache, ahead.")
    max_tokens: int = Field(64, ge=1, description="Tokens generated per prompt.")
    k: int = Field(4, ge=1, le=32, description="Drafted tokens per round.")
    repeats: int = Field(1, ge=1, description="Passes over every (mode, delay); modes take "
                         "turns in reverse order on every other pass.")
    workdir: Path = Field(Path("runs/rtt"), description="Where the clusters' logs go.")
    drafter_args: str = Field("", description="More drafter flags for the speculating modes, "
                              "e.g. '--send-ahead 3 --speculate-fanout 2'.")
    plot: Path | None = Field(None, description="Write the PNG here.")
    tree_nodes: int = Field(0, ge=0, description="Draft token trees of this many nodes, depth "
                            "k (0: chains).")
    tree_expansion: Literal["", "dynamic", "confidence"] = Field(
        "", description="How trees grow: dynamic (the default) or confidence.")


def run(settings: RttSettings) -> None:
    """Measure every (mode, delay) and print the table and what speculation wins back."""
    from cascade.bench.compare.run import machine

    s = settings
    target, drafter = s.models.folders()
    rows = measure(target, drafter, s.delays, s.workdir, s.max_tokens, s.k,
                   modes=tuple(s.modes), drafter_args=tuple(s.drafter_args.split()),
                   repeats=s.repeats, tree_nodes=s.tree_nodes, tree_expansion=s.tree_expansion)
    same = all(r.tokens == rows[0].tokens for r in rows)
    shape = f"trees of {s.tree_nodes} nodes" if s.tree_nodes else "chains"
    print(f"Machine: {machine()}; pair: {s.models.pair}; k = {s.k}, {shape}; {len(PROMPTS)} "
          f"prompts x {s.max_tokens} tokens x {s.repeats} passes, greedy; identical "
          f"output in every row: {same}.\n")
    print(table(rows))
    for mode in dict.fromkeys(r.mode for r in rows if r.mode != "off"):
        for delay in s.delays[1:]:
            share = recovered(rows, delay, mode)
            if share is not None:
                print(f"{mode} at {delay:g} ms one way recovers {100 * share:.0f} % of what the "
                      f"round trip costs lock-step decoding.")
    if s.plot:
        plot(rows, s.plot, f"Throughput vs round trip ({s.models.pair}, k = {s.k})")


if __name__ == "__main__":
    settings_command(RttSettings, run)()
