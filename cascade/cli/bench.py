"""``cascade bench <name>``: every benchmark as a subcommand (see cascade.bench). The scripts'
command lines are generated from their settings classes (``cascade.serving.settings_cli``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from cascade.bench.drafting import memory, ngram_copy, structured, suffix_lookup
from cascade.bench.load import admission, grpc_floor, prefix_chat, rtt, shared_prefill
from cascade.bench.reliability import chaos, faults, redis_durability
from cascade.bench.step import engine, gpu, plan_cost, tree_cost
from cascade.distill.measure import invariance, replay, tree_drafter_kv, tree_eval
from cascade.cli.options import DRAFTER_OPT, PAIR_OPT, TARGET_OPT, draft_tokens_option
from cascade.cli.options import pair_folders
from cascade.serving.settings_cli import command_line, settings_function

console = Console()


def compare(target: Path = TARGET_OPT, drafter: Path = DRAFTER_OPT,
          pair: str = PAIR_OPT,
          k: int = draft_tokens_option(0, "Drafted tokens per round; 0 picks the fastest of "
                                        "1, 2, 3, 4, 6 on the first prompts.", min=0, max=32),
          max_tokens: int = typer.Option(64, min=1, help="Tokens generated per prompt."),
          prompts_per_domain: int = typer.Option(2, min=1, max=4,
                                                 help="Prompts from each of prose, chat, code."),
          repeats: int = typer.Option(3, min=1, help="Runs of every prompt (medians reported)."),
          temperature: float = typer.Option(0.7, min=0.01, help="Temperature of sampling rows."),
          threads: int = typer.Option(2, min=1, help="torch threads of in-process methods."),
          families: list[str] = typer.Option(["core", "hf", "services"], "--family",
                                             help="Run only these (repeat the flag): core, hf, "
                                             "services."),
          out: Path = typer.Option(Path("runs/bench"), help="Where results.json, table.md "
                                   "and the PNG plots go.")) -> None:
    """Target-only, HF assisted generation, Cascade's core loop and Cascade's services on the
    same prompts and pair, side by side in one run."""
    from cascade.bench.output import save, show
    from cascade.bench.compare.run import BenchConfig, measure

    target, drafter = pair_folders(target, drafter, pair)
    try:
        config = BenchConfig(target=target, drafter=drafter, out=out, k=k,
                             max_new_tokens=max_tokens, per_domain=prompts_per_domain,
                             repeats=repeats, temperature=temperature, threads=threads,
                             families=tuple(families))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    rows, context = measure(config, console)
    show(rows, context, console)
    for path in save(rows, context, out):
        console.print(f"wrote {path}")


def bench_load(target: Path = TARGET_OPT, drafter: Path = DRAFTER_OPT,
               pair: str = PAIR_OPT,
               k: int = draft_tokens_option(4, min=1, max=32),
               sessions: list[int] = typer.Option([1, 2, 4, 8, 16, 32], "--sessions",
                                                  help="Concurrent clients (repeat the flag)."),
               max_tokens: int = typer.Option(32, min=1, help="Tokens per request."),
               window_s: float = typer.Option(20.0, min=1, help="Seconds measured per point."),
               soak_s: float = typer.Option(60.0, min=0, help="Seconds of the soak run with the "
                                            "most sessions (batched speculative mode)."),
               max_wait_ms: float = typer.Option(None, help="The batched verifiers' "
                                                 "--max-wait-ms (default: theirs)."),
               only: list[str] = typer.Option([], "--only", help="Run only this mode (repeat):"
                                              " unbatched, batched, batched-ssd, target-only, "
                                              "fixed-k<n>, auto, default, tree, tree-auto, "
                                              "tree-cape, tree-cape-auto (every mode but "
                                              "default drafts with the model)."),
               fixed_k: list[int] = typer.Option([1, 2, 4], "--fixed-k", help="The fixed-k "
                                                 "modes beside auto (repeat)."),
               domain: list[str] = typer.Option([], "--domain", help="Prompt domain the "
                                                "clients send (repeat; prose, chat, code)."),
               dtype: str = typer.Option("float32", help="The pods' dtype: float32 or "
                                         "bfloat16 (float32 by default: the same numbers on "
                                         "every machine; cascade up defaults to auto)."),
               tree_nodes: int = typer.Option(16, help="Nodes per round of the tree mode "
                                              "(depth k)."),
               repeats: int = typer.Option(1, min=1, help="Runs per mode and load, the modes "
                                           "taking turns in each: the table pools them, the "
                                           "comparison gives each ratio's range over the runs."),
               out: Path = typer.Option(Path("runs/bench-load"), help="Where load.json, "
                                        "load.md and load.png go.")) -> None:
    """The verifier under 1..32 concurrent streaming sessions: speculative unbatched and
    batched, target-only batched, fixed k, the auto schedule and token trees, side by side in
    one run."""
    from cascade.bench.load.sweep import LoadConfig, run_load
    from cascade.bench.load.report import comparison, save, table

    target, drafter = pair_folders(target, drafter, pair)
    try:
        config = LoadConfig(target, drafter, out, k, tuple(sessions), max_tokens, window_s,
                            soak_s, max_wait_ms, tuple(only), tuple(domain), dtype,
                            tuple(fixed_k), tree_nodes, repeats)
        config.modes()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc

    def progress(point) -> None:
        row = point.row()
        run = f" (run {row['repeat'] + 1})" if repeats > 1 else ""
        console.print(f"{row['mode']:<32} sessions {row['sessions']:>3}{run}: "
                      f"{row['tokens_per_s']:>7} tokens/s, ITL p50 {row['itl_p50_ms']} ms, "
                      f"errors {row['errors']}")

    result = run_load(config, progress)
    console.print(table(result))
    console.print(comparison(result))
    for path in save(result, out):
        console.print(f"wrote {path}")


def bench_tp(target: Path = typer.Option(None, help="Model folder (default: the tiny "
                                          "target; its heads must divide by --ranks)."),
             ranks: int = typer.Option(2, min=2, help="Ranks to split the target over."),
             dtype: str = typer.Option("float32", help="float32 or bfloat16."),
             repeats: int = typer.Option(7, min=1, help="Timed calls per cell after a "
                                         "warm-up (the median is reported)."),
             rows: str = typer.Option("1,8,32", help="The N rows x 1 token shapes."),
             drafts: str = typer.Option("4", help="The one-row drafts."),
             prefill: int = typer.Option(128, min=0, help="Prefill tokens (0: none)."),
             context: int = typer.Option(100, min=1, help="Cached tokens per row."),
             out: Path = typer.Option(Path("runs/bench-tp"), help="Where tp.json goes."),
             random_weights: bool = typer.Option(False, help="--target is a folder with a "
                                                 "config.json (or llama3-8b): every rank "
                                                 "builds it with the same random weights."),
             device: str = typer.Option("cpu", help="cpu, or cuda: one GPU per rank (NCCL).")
             ) -> None:
    """The verify engine's step with the target whole and split over ranks (tensor
    parallelism on this machine's cores), and what the sums over the ranks cost alone."""
    from cascade.bench.step.engine import int_list
    from cascade.bench.step.tensor_parallel import TpBenchConfig, main
    from cascade.core.model.tensor_parallel import TensorParallelError
    from cascade.core.model.weights import check_split

    target = target or pair_folders(None, None, "tiny")[0]
    if dtype not in ("float32", "bfloat16"):
        raise typer.BadParameter("float32 or bfloat16", param_hint="--dtype")
    try:
        check_split(str(target), ranks, random_weights)
    except TensorParallelError as exc:
        raise typer.BadParameter(str(exc), param_hint="--ranks") from exc
    main(TpBenchConfig(target, ranks, dtype, repeats, int_list(rows), int_list(drafts), prefill,
                       context, out, random_weights, device))


def bench_cascades(target: Path = TARGET_OPT, drafter: Path = DRAFTER_OPT,
                   pair: str = PAIR_OPT,
                   k: int = draft_tokens_option(4, min=1, max=32),
                   max_tokens: int = typer.Option(48, min=1, help="Tokens per prompt."),
                   prompts_per_domain: int = typer.Option(2, min=1, max=4, help="Prompts from "
                                                          "each of prose, chat, code."),
                   rules: list[str] = typer.Option(["chow", "diff", "opt", "token_v1",
                                                    "token_v2", "token_v3"], "--rule",
                                                   help="Cascade rules to sweep (repeat)."),
                   alphas: list[float] = typer.Option([0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0],
                                                      "--alpha", help="Alphas to sweep "
                                                      "(repeat)."),
                   threads: int = typer.Option(2, min=1, help="torch threads."),
                   services: bool = typer.Option(True, help="Also run every speculative "
                                                 "method on a local cluster (tokens/s on the "
                                                 "services, same tokens as in one process)."),
                   out: Path = typer.Option(Path("runs/bench-cascades"), help="Where "
                                            "cascades.json, cascades.md and cascades.png go.")
                   ) -> None:
    """Quality vs cost of the speculative cascade rules over alpha, beside lossless speculative
    decoding and a classic cascade (greedy; in one process, and on a local cluster unless
    --no-services)."""
    import json

    import torch

    from cascade.bench.drafting import cascades_eval as ev
    from cascade.bench.prompts import bench_prompts
    from cascade.bench.compare.run import machine
    from cascade.core.model.runner import ModelRunner, ModelSpec
    from cascade.protocol.settings import SamplingParams

    unknown = sorted(set(rules) - set(ev.RULES))
    if unknown or not all(0.0 <= a <= 1.0 for a in alphas):
        raise typer.BadParameter(f"--rule must be among {ev.RULES} (got {unknown}) and --alpha "
                                 "in [0, 1]")
    torch.set_num_threads(threads)
    target, drafter = pair_folders(target, drafter, pair)
    target_runner, drafter_runner = (ModelRunner.load(ModelSpec(str(f))) for f in (target,
                                                                                    drafter))
    prompts = bench_prompts(target_runner.tokenizer, prompts_per_domain)
    stops = () if target_runner.tokenizer.eos_token_id is None else (
        target_runner.tokenizer.eos_token_id,)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_tokens, stop_token_ids=stops)
    chosen = ev.methods(tuple(rules), tuple(alphas))
    console.print(f"{len(chosen)} methods x {len(prompts)} prompts, {machine()}")

    def progress(score) -> None:
        row = score.row()
        console.print(f"{row['method']:>9} {row['knob']:<5} passes/token "
                      f"{row['passes_per_token']:.3f}  {row['tokens_per_s']:>6} tokens/s  "
                      f"log-lik {row['mean_log_likelihood']:.3f}  argmax "
                      f"{row['target_argmax_fraction']:.3f}")

    scores = list(ev.evaluate(target_runner, drafter_runner, prompts, params, k, chosen,
                              progress))
    rows = [score.row() for score in scores]
    if services:
        from cascade.bench.drafting.cascades_services import run_on_services

        del target_runner, drafter_runner  # the cluster's pods load their own copies
        speculative = [s.method for s in scores if s.method.name != "classic"]
        runs = run_on_services(target, drafter, prompts, k, max_tokens, speculative, out,
                               lambda m, r: console.print(f"services {m.name} {m.knob}: "
                                                          f"{r.tokens_per_s} tokens/s"))
        ev.add_services(rows, scores, runs)
    out.mkdir(parents=True, exist_ok=True)
    context = {"machine": machine(), "k": k, "max_tokens": max_tokens, "prompts": len(prompts),
               "target": str(target.name), "drafter": str(drafter.name)}
    (out / "cascades.json").write_text(json.dumps({"context": context, "rows": rows}, indent=1))
    (out / "cascades.md").write_text(ev.rows_markdown(rows))
    ev.plot(rows, out / "cascades.png", f"greedy, k={k}, {len(prompts)} prompts x "
            f"{max_tokens} tokens")
    console.print(ev.rows_markdown(rows))
    console.print(f"wrote {out}/cascades.json, cascades.md, cascades.png")


SCRIPTS = (("admission", admission.AdmissionSettings, admission.run),
           ("chaos", chaos.ChaosSettings, chaos.run),
           ("engine", engine.EngineSettings, engine.run),
           ("faults", faults.FaultsSettings, faults.run),
           ("gpu", gpu.GpuSettings, gpu.run),
           ("grpc-floor", grpc_floor.GrpcFloorSettings, grpc_floor.run),
           ("invariance", invariance.InvarianceSettings, invariance.run),
           ("memory", memory.MemorySettings, memory.run),
           ("ngram-copy", ngram_copy.NgramCopySettings, ngram_copy.run),
           ("plan-cost", plan_cost.PlanCostSettings, plan_cost.run),
           ("prefix-chat", prefix_chat.PrefixChatSettings, prefix_chat.run),
           ("redis-durability", redis_durability.RedisDurabilitySettings, redis_durability.run),
           ("replay", replay.ReplaySettings, replay.run),
           ("rtt", rtt.RttSettings, rtt.run),
           ("shared-prefill", shared_prefill.SharedPrefillSettings, shared_prefill.run),
           ("structured", structured.StructuredSettings, structured.run),
           ("suffix-lookup", suffix_lookup.SuffixLookupSettings, suffix_lookup.run),
           ("tree-cost", tree_cost.TreeCostSettings, tree_cost.run),
           ("tree-drafter-kv", tree_drafter_kv.TreeDrafterKvSettings, tree_drafter_kv.run),
           ("tree-eval", tree_eval.TreeEvalSettings, tree_eval.run))
"""The benchmarks whose flags are a settings class: (command, class, what runs it)."""

bench_app = command_line(help="Benchmarks: each prints a table of ratios measured side by side "
                         "in one run (docs/benchmarks.md has the commands and latest results).",
                         no_args_is_help=True)
bench_app.command("compare")(compare)
bench_app.command("load")(bench_load)
bench_app.command("cascades")(bench_cascades)
bench_app.command("tp")(bench_tp)
for _name, _settings, _run in SCRIPTS:
    bench_app.command(_name)(settings_function(_settings, _run))
