"""The ``cascade`` command: run a local cluster, generate through it, build the tiny pair."""

from __future__ import annotations

import signal
import statistics
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import typer
from rich.console import Console
from rich.table import Table

from cascade.cli.bench import bench_app
from cascade.cli.models import distill, models_app
from cascade.cli.options import DRAFTER_OPT, PAIR_OPT, TARGET_OPT, draft_tokens_option
from cascade.cli.options import pair_folders
from cascade.cli.up import UpSettings
from cascade.core.paths import cache_root
from cascade.tools.client import GenerationSummary, stream_generation
from cascade.tools.local_cluster import LocalCluster
from cascade.tools.cluster_config import ClusterConfig
from cascade.serving.settings_cli import command_line, settings_function, validated

app = command_line(help="Cascade: speculative decoding across machines.")
app.add_typer(models_app, name="models")
app.command()(distill)
app.add_typer(bench_app, name="bench")
console = Console()


DTYPE_OPT = typer.Option("auto", help="The pods' dtype: float32, bfloat16 or auto (bfloat16 "
                         "where the hardware runs it fast, measured; float32 elsewhere).")
WORKDIR_OPT = typer.Option(cache_root() / "local", help="Folder for the processes' logs (each "
                           "start keeps the previous run's as *.log.1), Redis's data and the "
                           "mesh certificates.")


def _cluster(settings: UpSettings) -> ClusterConfig:
    """The local cluster ``settings`` describe, the pair prepared (a usage error: what to fix)."""
    try:
        settings.check_ports()
        target, drafter = pair_folders(settings.target, settings.drafter, settings.pair)
        return settings.cluster(target, drafter)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _fail(message: str) -> None:
    """One line saying what went wrong and what to do, and exit status 1 (no traceback)."""
    console.print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(1)


def up(settings: UpSettings) -> None:
    with running(LocalCluster(_cluster(settings)),
                 "starting redis, verifier, drafters, gateway") as cluster:
        _print_ready(cluster)
        cluster.processes["gateway"].wait()


app.command("up")(settings_function(UpSettings, up))


@contextmanager
def running(cluster: LocalCluster, starting: str):
    """``cluster`` started, then stopped however the block ends: Ctrl-C and SIGTERM (also
    while starting) stop it, a process that fails to start ends the command with one message
    and the log folder, never a traceback."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a background job ignores it
        signal.signal(sig, interrupt)
    try:
        with console.status(starting):
            cluster.start()  # stops what it started if it fails or is interrupted
    except (RuntimeError, TimeoutError) as exc:
        _fail(f"the cluster did not start: {exc}\n(logs in {cluster.config.workdir})")
    except KeyboardInterrupt:
        raise typer.Exit(130)
    try:
        yield cluster
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # stopping has its own timeouts
        with console.status("stopping"):
            cluster.stop()
        console.print("stopped")


def _print_ready(cluster: LocalCluster) -> None:
    """Where to reach what ``cascade up`` started, and a first command to try."""
    card = served_card(cluster.http_url)
    console.print(f"gateway: [bold]{cluster.http_url}/v1[/] (OpenAI API) serving model "
                  f"[bold]{card.get('id', '?')}[/] in [bold]{card.get('dtype', '?')}[/] "
                  f"(--dtype {cluster.config.dtype}), gRPC [bold]{cluster.grpc_address}[/]")
    console.print(f"playground: [bold]{cluster.http_url}/playground/[/]; logs in "
                  f"{cluster.config.workdir}")
    console.print("metrics: " + ", ".join(f"{name} {url}"
                                          for name, url in cluster.metrics_urls().items()))
    console.print(f"try: cascade generate --gateway {cluster.grpc_address} \"import os\"")
    console.print(f"pods speak mutual TLS (certificates in {cluster.config.workdir}/mesh); "
                  "Redis wants the password in its redis-auth.conf")
    console.print("Ctrl-C stops the cluster.")


def served_card(http_url: str) -> dict:
    """The gateway's model card (``id``: what requests name as ``model``; ``dtype``: what the
    verifiers serve it in), or {} if it is silent."""
    try:
        return dict(httpx.get(f"{http_url}/v1/models", timeout=5).json()["data"][0])
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
        return {}


@app.command("mesh-certs")
def mesh_certs(out: Path = typer.Option(..., help="Folder to write tls.crt, tls.key, ca.crt."),
               server_name: str = typer.Option("cascade-mesh", help="The DNS name in the "
                                               "certificate (pods' --tls-server-name)."),
               days: int = typer.Option(365, help="Validity in days.")) -> None:
    """Make a CA and one certificate every mesh member can use (pods' and the gateway's
    --tls-dir). For trying mutual TLS out; production issues them with cert-manager."""
    from cascade.serving.mesh.certs import make_mesh_certs

    folder = make_mesh_certs(out, server_name, days)
    console.print(f"wrote {folder}/tls.crt, tls.key, ca.crt (the CA's key is not kept)")


def _print_round(response) -> None:
    console.print(response.accepted_text, style="green", end="", markup=False, highlight=False)
    chosen = response.text[len(response.accepted_text):]
    console.print(chosen, end="", markup=False, highlight=False)


def _report(spec: GenerationSummary, base: GenerationSummary | None, k: int,
            schedule: str = "", tree_nodes: int | None = None) -> None:
    table = Table(title="generation")
    table.add_column("")
    label = f"speculative (k={k})" if schedule == "fixed" else f"{schedule or 'auto'} (k<={k})"
    if tree_nodes:
        label = f"trees (<={tree_nodes} nodes, depth<={k})"
    table.add_column(label, justify="right")
    if base:
        table.add_column("target only", justify="right")
    rows = [("tokens", lambda s: f"{len(s.token_ids)}"),
            ("tokens/s", lambda s: f"{s.tokens_per_s:.1f}"),
            ("time to first token", lambda s: f"{s.first_token_s * 1000:.0f} ms"),
            ("acceptance rate", lambda s: f"{s.stats.acceptance_rate:.2f}"),
            ("mean drafted length", lambda s: f"{s.stats.mean_draft_length:.2f}"),
            ("rounds", lambda s: f"{s.num_rounds}"),
            ("rounds without a draft", lambda s: f"{s.num_undrafted}"),
            ("deferred positions", lambda s: f"{s.stats.num_deferred_tokens}"),
            ("forced / filled tokens",
             lambda s: f"{s.stats.num_forced_tokens} / {s.stats.num_filled_tokens}")]
    for name, cell in rows:
        table.add_row(name, cell(spec), *([cell(base)] if base else []))
    console.print(table)
    if spec.num_undrafted and k:
        console.print(f"{spec.num_undrafted} of {spec.num_rounds} rounds had no draft: the verifier "
                      "decoded them alone, because the goodput planner measured that drafting "
                      "would not pay at its load (draft_schedule auto; --schedule fixed drafts "
                      "every round), while a block was on its way, or because the drafting "
                      "method found nothing to propose", highlight=False)
    if spec.overhead_us:
        console.print(f"per-round overhead (drafted rounds: round - verify - drafting not "
                      f"hidden by drafting during verification): median "
                      f"{statistics.median(spec.overhead_us) / 1000:.2f} ms")
    if base and base.tokens_per_s:
        console.print(f"speedup over target-only: [bold]{spec.tokens_per_s / base.tokens_per_s:.2f}x[/]"
                      f"; identical output: {spec.token_ids == base.token_ids}")


@app.command()
def generate(prompt: str,
             gateway: str = typer.Option("127.0.0.1:50050", help="Gateway gRPC address; "
                                         "several, comma-separated, to resume a broken stream "
                                         "on the next."),
             max_tokens: int = typer.Option(64, help="Tokens to generate."),
             num_draft_tokens: int = draft_tokens_option(4),
             temperature: float = typer.Option(0.0, help="0 = greedy."),
             seed: int = typer.Option(0, help="Sampling seed."),
             chat: bool = typer.Option(True, help="Send the prompt through the chat template."),
             baseline: bool = typer.Option(True, help="Also run target-only to compare."),
             rule: str | None = typer.Option(None, help="A speculative cascade (lossy): chow, "
                                             "diff, opt, token_v1, token_v2 or token_v3; unset "
                                             "is lossless."),
             alpha: float = typer.Option(0.0, help="The cascade's quality knob in [0, 1]."),
             schedule: str = typer.Option("", help="draft_schedule: auto (draft only what "
                                          "pays at the verifier's load), fixed (always k) or "
                                          "adaptive (k follows the drafter's success); empty: "
                                          "the gateway's default (auto)."),
             tree_nodes: int | None = typer.Option(None, help="Draft token trees of at most "
                                                   "this many nodes, k deep (0: chains; unset: "
                                                   "the gateway's default). Sampled trees use "
                                                   "the keyed rule, and so does the baseline, so "
                                                   "their texts compare."),
             keyed: bool = typer.Option(False, help="The keyed lossless rule: a seeded sampled "
                                        "text depends on the prompt and seed alone."),
             tree_expansion: str = typer.Option("", help="How trees grow: dynamic (EAGLE-2) or "
                                                "confidence (CAPE: the drafter's chain plus "
                                                "runners-up where it is unsure); empty: dynamic."),
             draft_method: str = typer.Option("", help="Drafting method (auto, model, ngram, "
                                              "suffix, ...); empty: the gateway's default "
                                              "(auto).")
             ) -> None:
    """Stream a generation: green text was drafted and accepted, plain text the verifier chose."""
    acceptance = "keyed" if keyed or (tree_nodes and temperature > 0) else ""
    run: dict[str, Any] = dict(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                               seed=seed, chat=chat, acceptance="" if rule else acceptance)
    console.print(prompt, style="bold", end="\n" if chat else "", markup=False, highlight=False)
    try:
        spec = stream_generation(gateway, num_draft_tokens=num_draft_tokens,
                                 on_response=_print_round, cascade_rule=rule,
                                 cascade_alpha=alpha, schedule=schedule, tree_nodes=tree_nodes,
                                 tree_expansion=tree_expansion, draft_method=draft_method,
                                 **run)
        console.print()
        base = stream_generation(gateway, num_draft_tokens=0, **run) if baseline else None
    except grpc.RpcError as exc:
        _fail(f"the gateway at {gateway} answered {exc.code().name}: {exc.details()}"
              + (" (is `cascade up` running? --gateway names another address)"
                 if exc.code() == grpc.StatusCode.UNAVAILABLE else ""))
    _report(spec, base, num_draft_tokens, schedule, tree_nodes)


@app.command()
def demo(prompt: str = typer.Argument("Explain how a rainbow forms."),
         target: Path = TARGET_OPT, drafter: Path = DRAFTER_OPT, pair: str = PAIR_OPT,
         max_tokens: int = typer.Option(48),
         num_draft_tokens: int = draft_tokens_option(4),
         port: int = typer.Option(8000, help="Gateway HTTP port (0: a free one)."),
         grpc_port: int = typer.Option(50050, help="Gateway gRPC port (0: a free one)."),
         dtype: str = DTYPE_OPT, workdir: Path = WORKDIR_OPT) -> None:
    """Start the local cluster, run one generation through it, and stop it."""
    settings = validated(UpSettings, target=target, drafter=drafter, pair=pair, port=port,
                         grpc_port=grpc_port, dtype=dtype, workdir=workdir)
    with running(LocalCluster(_cluster(settings)),
                 "starting redis, verifier, drafter, gateway") as cluster:
        with console.status("warming up (first passes allocate)"):
            for k in (num_draft_tokens, 0):  # so neither measured run pays for the cold start
                stream_generation(cluster.grpc_address, prompt, 4, k)
        generate(prompt, gateway=cluster.grpc_address, max_tokens=max_tokens,
                 num_draft_tokens=num_draft_tokens, temperature=0.0, seed=0, chat=True,
                 baseline=True, rule=None, alpha=0.0, schedule="", tree_nodes=None,
                 keyed=False, tree_expansion="", draft_method="")
