"""``cascade bench compare``: every method on the same prompts and pair in one run, then the
table, the goals, JSON and PNG plots. In-process families run in child processes one after
another, then the services; nothing runs concurrently with what is being measured."""

from __future__ import annotations

import multiprocessing
import queue
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import AutoTokenizer

from cascade.bench.compare.hf import HF_CANDIDATES
from cascade.bench.compare.inprocess import K_CANDIDATES, FamilyResult, Job, run_family
from cascade.bench.compare.output import save, show
from cascade.bench.machine import die_with_parent, machine
from cascade.bench.measure import summarise
from cascade.bench.prompts import bench_prompts
from cascade.bench.compare.report import Costs, Row, build_rows
from cascade.bench.compare.services import ServicesResult, run_services
from cascade.serving.settings_cli import aliases
from cascade.tools.pairs import MODEL_DRAFTER, PairSettings

FAMILIES = ("core", "hf", "services")
METHODS_PER_FAMILY = {"core": 3, "hf": 5, "services": 3}


@dataclass(frozen=True)
class BenchConfig:
    target: Path
    drafter: Path
    out: Path = Path("runs/bench")
    k: int = 0
    """Drafted tokens per round; 0 picks the fastest of K_CANDIDATES (as HF's best is picked)."""
    max_new_tokens: int = 64
    per_domain: int = 2
    repeats: int = 3
    temperature: float = 0.7
    threads: int = 2
    """torch threads of the in-process methods (the services use one per pod)."""
    seed: int = 1
    families: tuple[str, ...] = FAMILIES
    """Which of core, hf, services to run (each brings its own target-only baseline)."""
    hf_drafter: Path | None = None
    """The causal-LM drafter for HF assisted generation when ``drafter`` is a feature drafter
    (default: the model drafter shipped for SmolLM2)."""

    def __post_init__(self) -> None:
        unknown = set(self.families) - set(FAMILIES)
        if unknown or not self.families:
            raise ValueError(f"families must be a non-empty subset of {FAMILIES}, "
                             f"got {sorted(self.families)}")


def _in_child(job: Job, tick) -> FamilyResult:
    """Run one in-process family in a fresh spawned process, forwarding its progress ticks."""
    context = multiprocessing.get_context("spawn")
    manager = SyncManager(ctx=context)
    manager.start(die_with_parent)  # neither process outlives a killed benchmark
    with manager, ProcessPoolExecutor(1, mp_context=context,
                                      initializer=die_with_parent) as pool:
        ticks = manager.Queue()
        future = pool.submit(run_family, job, ticks)
        while not future.done():
            try:
                ticks.get(timeout=0.2)
                tick()
            except queue.Empty:
                pass
        result = future.result()
        while not ticks.empty():
            ticks.get()
            tick()
    return result


def _total(job: Job, families: tuple[str, ...]) -> int:
    generations = len(job.prompts) * job.repeats
    first = min(2, len(job.prompts))
    sweeps = 2 * len(HF_CANDIDATES) * first if "hf" in families else 0
    if "core" in families and not job.k:
        sweeps += len(K_CANDIDATES) * first
    return sum(METHODS_PER_FAMILY[f] for f in families) * generations + sweeps


def _chosen_k(job: Job, families: dict[str, FamilyResult]) -> int:
    """The k the core family used (it picks one when asked for 0); 4 when it did not run."""
    if job.k:
        return job.k
    if "core" in families:
        return next(m.k for m in families["core"].methods if m.k)
    return 4


def _services_costs(services: ServicesResult) -> Costs:
    """Drafter ms per drafted token (greedy speculative run) and target ms per decoding pass
    (target-only run), as the pods measured them."""
    spec = next(m for m in services.methods if m.k and not m.sampling)
    alone = next(m for m in services.methods if m.k == 0)
    return Costs(summarise(spec.runs).draft_ms_per_token, summarise(alone.runs).verify_ms_per_pass)


def measure(config: BenchConfig, console: Console) -> tuple[list[Row], dict]:
    tokenizer = AutoTokenizer.from_pretrained(config.target)
    job = Job("core", config.target, config.drafter,
              tuple(bench_prompts(tokenizer, config.per_domain)), config.max_new_tokens, config.k,
              config.temperature, config.repeats, config.threads, config.seed,
              config.hf_drafter or MODEL_DRAFTER)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("benchmark", total=_total(job, config.families))

        def tick() -> None:
            progress.advance(task)

        families, services = {}, None
        for family in [f for f in ("core", "hf") if f in config.families]:
            progress.update(task, description=f"{family} (in process)")
            families[family] = _in_child(replace(job, family=family), tick)
        job = replace(job, k=_chosen_k(job, families))
        if "services" in config.families:
            progress.update(task, description="services on loopback")
            with tempfile.TemporaryDirectory(prefix="cascade-bench-") as workdir:
                services = run_services(job, Path(workdir), tick)
    costs = {f: Costs(r.drafter_ms, r.target_ms) for f, r in families.items()}
    rss = {f: f"{r.peak_rss_mb:.0f}" if r.peak_rss_mb else "–" for f, r in families.items()}
    methods = [m for f in families.values() for m in f.methods]
    if services is not None:
        methods += services.methods
        costs["services"] = _services_costs(services)
        rss["services"] = ", ".join(f"{n} {v:.0f}" for n, v in services.peak_rss_mb.items() if v)
    rows = build_rows(methods, costs, rss, config.temperature)
    context = {"machine": machine(), "k": job.k,
               "pinning": services.pinning if services else "–",
               "prompts": len(job.prompts), "costs_ms": {f: vars(c) for f, c in costs.items()}}
    return rows, context


class CompareSettings(BaseModel):
    """Target-only, HF assisted generation, Cascade's core loop and Cascade's services on the
    same prompts and pair, side by side in one run."""

    models: PairSettings = PairSettings()
    num_draft_tokens: int = Field(BenchConfig.k, ge=0, le=32, json_schema_extra=aliases("--k"),
                                  description="Drafted tokens per round; 0 picks the fastest "
                                  "of 1, 2, 3, 4, 6 on the first prompts.")
    max_tokens: int = Field(BenchConfig.max_new_tokens, ge=1, description="Tokens generated "
                            "per prompt.")
    prompts_per_domain: int = Field(BenchConfig.per_domain, ge=1, le=4, description="Prompts "
                                    "from each of prose, chat, code.")
    repeats: int = Field(BenchConfig.repeats, ge=1, description="Runs of every prompt (medians "
                         "reported).")
    temperature: float = Field(BenchConfig.temperature, ge=0.01, description="Temperature of "
                               "sampling rows.")
    threads: int = Field(BenchConfig.threads, ge=1, description="torch threads of in-process "
                         "methods.")
    family: list[Literal["core", "hf", "services"]] = Field(
        list(BenchConfig.families), min_length=1, description="Run only these (repeat the "
        "flag): core, hf, services.")
    out: Path = Field(BenchConfig.out, description="Where results.json, table.md and the PNG "
                      "plots go.")


def run(settings: CompareSettings) -> None:
    """Measure every method, print the table and the goals, save the files."""
    s, console = settings, Console()
    target, drafter = s.models.folders(console.print)
    config = BenchConfig(target=target, drafter=drafter, out=s.out, k=s.num_draft_tokens,
                         max_new_tokens=s.max_tokens, per_domain=s.prompts_per_domain,
                         repeats=s.repeats, temperature=s.temperature, threads=s.threads,
                         families=tuple(s.family))
    rows, context = measure(config, console)
    show(rows, context, console)
    for path in save(rows, context, s.out):
        console.print(f"wrote {path}")
