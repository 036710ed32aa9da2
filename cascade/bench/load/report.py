"""The tables, plot and files of ``cascade bench load`` (``cascade.bench.load.sweep``'s result)."""

from __future__ import annotations

import json
from pathlib import Path

TARGET_ONLY = "target-only, batched"


def table(result: dict) -> str:
    lines = ["| mode | sessions | tokens/s | ITL p50 ms | ITL p99 ms | TTFT p50 ms | requests "
             "| errors | mean drafted | rounds at 0 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        sessions = f"{p['sessions']} (soak, {p['window_s']:.0f} s)" if p["soak"] else p["sessions"]
        lines.append(f"| {p['mode']} | {sessions} | {p['tokens_per_s']} | {p['itl_p50_ms']}"
                     f" | {p['itl_p99_ms']} | {p['ttft_p50_ms']} | {p['requests']} "
                     f"| {p['errors']} | {p.get('mean_drafted', '-')} "
                     f"| {p.get('rounds_at_0', '-')} |")
    return "\n".join(lines)


def comparison(result: dict) -> str:
    """auto beside the best of target-only and the fixed-k modes, per number of sessions (the
    runs pooled); with repeated runs, also each ratio's range over the runs, each run's modes
    measured in turn."""
    rows = [p for p in result["points"] if not p["soak"]]
    auto, rivals = _contenders({p["mode"] for p in rows})
    if auto is None or not rivals:
        return ""
    runs = [p for p in result.get("runs", []) if not p["soak"]]
    lines = ["| sessions | target-only | best fixed k | auto | auto / best | ITL p99 auto / "
             "target-only |" + (" auto / best per run | ITL p99 ratio per run |" if runs else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if runs else "")]
    for sessions in sorted({p["sessions"] for p in rows}):
        ratios = _ratios([p for p in rows if p["sessions"] == sessions], auto, rivals)
        if ratios is None:
            continue
        target, best_fixed, mine, speed, itl = ratios
        fixed_text = (f"{best_fixed['tokens_per_s']} ({best_fixed['mode'].split()[-1]})"
                      if best_fixed else "-")
        line = (f"| {sessions} | {target['tokens_per_s'] if target else '-'} | {fixed_text} | "
                f"{mine['tokens_per_s']} | {speed:.2f} | {_text(itl)} |")
        if runs:
            each = [_ratios([p for p in runs if p["sessions"] == sessions
                             and p["repeat"] == repeat], auto, rivals)
                    for repeat in sorted({p["repeat"] for p in runs})]
            each = [r for r in each if r is not None]
            line += (f" {_spread([r[3] for r in each])} | "
                     f"{_spread([r[4] for r in each if r[4] is not None])} |")
        lines.append(line)
    return "\n".join(lines)


def _contenders(names: set[str]) -> tuple[str | None, list[str]]:
    auto = next((n for n in names if n.startswith("auto (")), None)  # chains; not auto trees
    return auto, [n for n in names if n == TARGET_ONLY or n.startswith("fixed k=")]


def _ratios(rows: list[dict], auto: str, rivals: list[str]) -> tuple | None:
    """(target-only's row, the best fixed k's, auto's, auto / the best of them, auto's ITL p99
    / target-only's) among ``rows`` (one load, one run or pooled); None without auto."""
    at = {p["mode"]: p for p in rows}
    fixed = [at[n] for n in rivals if n.startswith("fixed k=") and n in at]
    best_fixed = max(fixed, key=lambda p: p["tokens_per_s"], default=None)
    target = at.get(TARGET_ONLY)
    best = max([p["tokens_per_s"] for p in (target, best_fixed) if p], default=0)
    mine = at.get(auto)
    if mine is None or not best:
        return None
    itl = (mine["itl_p99_ms"] / target["itl_p99_ms"]
           if target and target["itl_p99_ms"] else None)
    return target, best_fixed, mine, mine["tokens_per_s"] / best, itl


def _text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in dict.fromkeys(p["mode"] for p in result["points"]):
        rows = [p for p in result["points"] if p["mode"] == mode and not p["soak"]]
        left.plot([p["sessions"] for p in rows], [p["tokens_per_s"] for p in rows], "o-",
                  label=mode)
        right.plot([p["sessions"] for p in rows], [p["itl_p50_ms"] for p in rows], "o-",
                   label=mode)
    for ax, label in ((left, "committed tokens/s (verifier)"), (right, "ITL p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming sessions")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle(f"Verifier under load ({result['cpu']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "load.json", out / "load.md", out / "load.png"]
    paths[0].write_text(json.dumps(result, indent=1))
    paths[1].write_text(table(result) + "\n\n" + comparison(result) + "\n")
    plot(result, paths[2])
    return paths
