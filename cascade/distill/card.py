"""The model card written next to a distilled drafter: how it was made and what it measures."""

from __future__ import annotations

import json
from pathlib import Path

from cascade.distill.measure.evaluate import PairReport


def _curve(history: list[dict], points: int = 8) -> list[str]:
    """Live acceptance estimate over training time, averaged over windows of chunks."""
    trained = [h for h in history if h.get("agreement") is not None]
    if not trained:
        return []
    size = max(1, len(trained) // points)
    rows = []
    for start in range(0, len(trained), size):
        window = trained[start : start + size]
        agreement = sum(h["agreement"] for h in window) / len(window)
        estimate = sum(h["estimated_acceptance"] for h in window) / len(window)
        last = window[-1]
        rows.append(f"| {last['elapsed_s'] / 60:.0f} | {last['answer_tokens']:,} | "
                    f"{agreement:.3f} | {estimate:.3f} |")
    return rows


def write_card(folder: Path, report: PairReport, command: str, notes: str) -> Path:
    history = json.loads((folder / "distill_history.json").read_text())
    config = history["config"]
    lines = [
        f"# {folder.name}", "",
        "A drafter for SmolLM2-135M-Instruct, made by `cascade distill` (online "
        "self-distillation on the target's own answers; restricted vocabulary).", "",
        "## How it was made", "", "```", command, "```", "", notes, "",
        "| setting | value |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in config.items() if k not in ("target", "out")],
        "", "## Measured (greedy, draft length 4, held-out prompts, float32, 2 threads)", "",
        "| metric | value |", "|---|---|",
        f"| acceptance | {report.acceptance:.3f} |",
        f"| acceptance per prompt | {' '.join(f'{a:.2f}' for a in report.per_prompt)} |",
        f"| target ms/token | {report.target_ms:.2f} |",
        f"| drafter ms/token | {report.drafter_ms:.2f} |",
        f"| cost ratio (drafter / target) | {report.cost_ratio:.3f} |",
        f"| in-process speculative tokens/s | {report.speculative_tokens_per_s:.1f} |",
        f"| target-only tokens/s | {report.target_only_tokens_per_s:.1f} |",
        f"| speedup | {report.speedup:.2f}x |",
        "", "## Training curve (live estimate on each fresh batch, before training on it)", "",
        "| minutes | answer tokens | top-1 agreement | estimated acceptance@4 |",
        "|---|---|---|---|", *_curve(history["history"]), "",
        "Licence: derived from SmolLM2-135M-Instruct (Apache-2.0).", "",
    ]
    path = folder / "README.md"
    path.write_text("\n".join(lines))
    return path


def write_feature_card(folder: Path, report: PairReport | None, command: str, notes: str
                       ) -> Path:
    """The card of a feature drafter: recipe, the held-out curve its exports recorded, and the
    pair measured with the real loop (when given)."""
    history = json.loads((folder / "distill_history.json").read_text())
    curve = [h for h in history["history"] if "held_out_acceptance_k4" in h]
    lines = [
        f"# {folder.name}", "",
        "A feature drafter (EAGLE-3 style: one decoder layer on the target's hidden states) for "
        "SmolLM2-135M-Instruct, made by `cascade distill --kind feature`. The folder holds the "
        "drafter's own weights; the embedding and head are read from the target's folder "
        "(`--target-model` on the drafter pod).", "",
        "## How it was made", "", "```", command, "```", "", notes, "",
        "| setting | value |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in history["config"].items()],
        "", "## Held-out curve (greedy acceptance at k = 4, replayed exactly on held-out "
        "greedy answers at each export)", "",
        "| minutes of training | optimiser steps | acceptance@4 | mean accepted length |",
        "|---|---|---|---|",
        *[f"| {h['elapsed_s'] / 60:.0f} | {h['steps']} | {h['held_out_acceptance_k4']:.3f} | "
          f"{h['mean_accepted_length']:.2f} |" for h in curve],
    ]
    if report is not None:
        lines += [
            "", "## Measured with the real loop (greedy, k = 4, held-out prompts, float32)", "",
            "| metric | value |", "|---|---|",
            f"| acceptance | {report.acceptance:.3f} |",
            f"| mean accepted length | {report.mean_accepted_length:.2f} |",
            f"| drafter ms/token | {report.drafter_ms:.2f} |",
            f"| cost ratio (drafter / target) | {report.cost_ratio:.3f} |",
            f"| ideal speedup | {report.ideal_speedup:.2f}x |",
            f"| in-process speedup | {report.speedup:.2f}x |",
        ]
    lines += ["", "Licence: derived from SmolLM2-135M-Instruct (Apache-2.0).", ""]
    path = folder / "README.md"
    path.write_text("\n".join(lines))
    return path
