"""Show and save a ``cascade bench compare`` run: console table and goals, results.json, table.md, PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cascade.bench.compare.plots import plot_speedups, plot_throughput
from cascade.bench.compare.report import COLUMNS, Row, goals, markdown_table, row_cells


SPEED = ("method", "mode", "tokens/s", "speedup", "TTFT ms", "ITL p50 ms", "ITL p99 ms",
         "same as greedy")
SPECULATION = ("method", "mode", "acceptance", "mean acc. len", "passes/token", "ideal",
               "of ideal", "v", "ideal (v)", "of ideal (v)", "overhead ms/round")


def _table(rows: list[Row], columns: tuple[str, ...], title: str) -> Table:
    """A console-width slice of the full table (the markdown file has every column)."""
    table = Table(title=title)
    picks = [COLUMNS.index(c) for c in columns]
    for column in columns:
        table.add_column(column, justify="left" if column == "method" else "right")
    for row in rows:
        cells = row_cells(row)
        table.add_row(*(cells[i] for i in picks))
    return table


def show(rows: list[Row], context: dict, console: Console) -> None:
    title = f"cascade bench compare: {context['prompts']} prompts, {context['machine']}"
    console.print(_table(rows, SPEED, title))
    console.print(_table(rows, SPECULATION, "speculation"))
    console.print(_table(rows, ("method", "mode", "peak RSS MiB"), "peak resident memory"))
    checks = Table(title="goals (greedy)")
    for column in ("goal", "target", "measured"):
        checks.add_column(column)
    for goal in goals(rows):
        checks.add_row(*goal)
    console.print(checks)


def goals_markdown(rows: list[Row]) -> str:
    lines = ["| goal | target | measured |", "|---|---|---|"]
    lines += [f"| {g} | {t} | {m} |" for g, t, m in goals(rows)]
    return "\n".join(lines) + "\n"


def save(rows: list[Row], context: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    results = {"context": context, "rows": [r.as_dict() for r in rows]}
    paths = [out / "results.json", out / "table.md"]
    paths[0].write_text(json.dumps(results, indent=1, default=str))
    paths[1].write_text(f"Machine: {context['machine']}; services pinned: "
                        f"{context['pinning']}.\n\n" + markdown_table(rows) + "\n"
                        + goals_markdown(rows))
    title = f"{context['prompts']} prompts"
    paths.append(plot_throughput(rows, out / "throughput.png", f"tokens/s by domain, {title}"))
    paths.append(plot_speedups(rows, out / "speedup.png", f"measured vs ideal speedup, {title}"))
    return paths
