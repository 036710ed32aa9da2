"""PNG plots of a benchmark run (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from cascade.bench.compare.report import Row


def _label(row: Row) -> str:
    best = row.note and "best" in row.method
    return f"{row.method}\n{row.mode}" + (f"\n{row.note}" if best else "")


def _axes(num_bars: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(max(8, 1.1 * num_bars), 4.8))


def _save(fig, ax, rows: list[Row], path: Path, title: str, ylabel: str) -> Path:
    import matplotlib.pyplot as plt

    ax.set_xticks(range(len(rows)), [_label(r) for r in rows], rotation=60, ha="right",
                  fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_throughput(rows: list[Row], path: Path, title: str) -> Path:
    """Tokens/s of every method, one bar per prompt domain."""
    fig, ax = _axes(len(rows))
    domains = list(rows[0].per_domain_tokens_per_s)
    width = 0.8 / len(domains)
    for i, domain in enumerate(domains):
        xs = [j + (i - (len(domains) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [r.per_domain_tokens_per_s.get(domain, 0) for r in rows], width, label=domain)
    return _save(fig, ax, rows, path, title, "tokens/s (median of repeats)")


def plot_speedups(rows: list[Row], path: Path, title: str) -> Path:
    """Measured speedup next to the ideal one for every speculative method."""
    spec = [r for r in rows if r.ideal is not None]
    fig, ax = _axes(len(spec))
    xs = range(len(spec))
    ax.bar([x - 0.2 for x in xs], [r.speedup for r in spec], 0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [r.ideal for r in spec], 0.4, label="ideal (from a, c, k)")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    return _save(fig, ax, spec, path, title, "speedup over its own target-only decoding")
