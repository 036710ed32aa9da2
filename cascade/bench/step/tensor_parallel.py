"""``cascade bench tp``: the verify engine's step with the target whole and split over ranks.

    cascade bench tp [--target DIR] [--ranks 2] [--dtype float32] [--repeats 7]
                     [--rows 1,8,32] [--drafts 4] [--prefill 128] [--context 100] [--out DIR]
                     [--random-weights] [--device cuda]

One process holds the whole target and rank 0 of the split one
(``cascade.core.parallel.rank_processes``: the other ranks are processes of their own). Per shape, the
whole target's columns are timed in turn, call after call (a machine that slows down slows
every column alike), then the split target's, apart: the all-cores columns' threads would
otherwise spin on the cores the ranks' messages need. Threads: the CPU's cores are shared
among the ranks (2 cores, 2 ranks: one thread each), and the whole target is timed with all
the cores and with one rank's share. Columns, milliseconds per step (``VerifyEngine.step``, acceptance
and commit included; the default invariant pass and the plain one):

- whole: the unsplit target;
- split: the target over ``ranks`` ranks;
- sums alone: the step's sums over the ranks without the model: 2 per layer (the attention's
  and the MLP's output projections), each of [tokens, hidden] (``Leader.rehearse``).
The last column says what one step sums over the ranks.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field, model_validator
from rich.console import Console
from rich.table import Table

from cascade.bench.step.engine import (COMMA_LIST, EngineBenchConfig, comma_list,
                                       default_threads, int_list)
from cascade.bench.step.rows import EngineRows
from cascade.bench.step.timing import interleaved
from cascade.bench.step.device import device_name, is_cuda, synchronizer
from cascade.bench.step.report import Shape
from cascade.bench.machine import machine
from cascade.core.parallel import rank_processes
from cascade.core.model.dtypes import cpu_flags
from cascade.core.model.runner import DTYPES, ModelRunner, ModelSpec
from cascade.core.model.weights import check_split
from cascade.serving.settings_cli import settings_command
from cascade.tools.pairs import default_target


SETTLE_S = 0.5
"""Pause before each phase: the OpenMP threads of the all-cores columns stop spinning, so
they do not take the cores the ranks' messages need."""


@dataclass(frozen=True)
class TpBenchConfig:
    target: Path
    ranks: int = 2
    dtype: str = "float32"
    repeats: int = 7
    rows: tuple[int, ...] = (1, 8, 32)
    drafts: tuple[int, ...] = (4,)
    prefill: int = 128
    context: int = 100
    out: Path = Path("runs/bench-tp")
    random_weights: bool = False
    """``target`` is a config (a folder's config.json, or a built-in name): random weights."""
    device: str = "cpu"
    """cpu, or cuda: the whole target on the first GPU, the ranks one GPU each (NCCL)."""

    def engine_config(self, threads: int) -> EngineBenchConfig:
        return EngineBenchConfig(self.target, (self.dtype,), threads, self.repeats,
                                 self.context, False, self.out, self.rows, self.drafts, (),
                                 self.prefill, device=self.device,
                                 random_weights=self.random_weights, engine_compile=False)


@dataclass(frozen=True)
class TpRow:
    shape: str
    tokens: int
    cells: dict[str, float]
    """Milliseconds per step, by column."""
    sums: int
    """Sums over the ranks per step (2 per layer) ..."""
    sum_bytes: int
    """... each of [tokens, hidden] in the dtype."""


def run_tp_bench(config: TpBenchConfig, console: Console | None = None) -> list[TpRow]:
    console = console or Console()
    cores = default_threads()
    share = max(1, cores // config.ranks)
    spec = ModelSpec(str(config.target), config.dtype, config.device)
    whole = ModelRunner.load(spec, random_weights=config.random_weights)
    console.print(f"starting {config.ranks} ranks ({share} thread(s) each) ...")
    split = rank_processes.load_sharded(spec, config.ranks, share, config.random_weights)
    try:
        return _measure(config, whole, split, {"all cores": cores, "one share": share},
                        console)
    finally:
        rank_processes.stop_ranks(split)


def _measure(config: TpBenchConfig, whole: ModelRunner, split: ModelRunner,
             threads: dict[str, int], console: Console) -> list[TpRow]:
    engine_config = config.engine_config(threads["all cores"])
    engines = {(name, inv): EngineRows(runner, inv, engine_config)
               for name, runner in (("whole", whole), ("split", split))
               for inv in (True, False)}
    hidden, dtype = whole.model.config.hidden_size, DTYPES[config.dtype]
    sums = 2 * whole.model.config.num_hidden_layers
    element = torch.empty((), dtype=dtype).element_size()
    leader = split.model.cascade_leader
    on_cpu, sync = not is_cuda(config.device), synchronizer(config.device)
    results = []
    for shape in engine_config.shapes():
        phases: dict[str, dict] = {"whole": {}, "split": {}}
        for (name, invariant), rows in engines.items():
            mode = "invariant" if invariant else "plain"
            counts = {"whole": [("all cores", threads["all cores"]),
                                ("one share", threads["one share"])][: 1 + on_cpu],
                      "split": [("", threads["one share"])]}[name]
            for label, count in counts:
                column = f"{name} {mode}" + (f", {label}" if label else "")
                phases[name][column] = _with_threads(rows, shape, count)
        tokens = shape.rows * shape.tokens
        phases["split"]["sums alone"] = lambda t=tokens: (
            lambda: leader.rehearse(t, hidden, dtype, sums))
        medians = {}
        for prepares in phases.values():  # apart: the whole model's threads idle meanwhile
            time.sleep(SETTLE_S)
            medians.update(interleaved(prepares, config.repeats, sync)[0])
        for rows in engines.values():
            rows.close_prefill()
        results.append(TpRow(shape.name, tokens, medians, sums, tokens * hidden * element))
        console.print(f"  {shape.name}: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    for rows in engines.values():
        rows.close()
    return results


def _with_threads(rows: EngineRows, shape: Shape, count: int):
    def prepare():
        torch.set_num_threads(count)
        return rows.prepare(shape)
    return prepare


def report(config: TpBenchConfig, results: list[TpRow]) -> Table:
    flags = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx2"))))
    where = machine() + (f", {device_name(config.device)}" if is_cuda(config.device) else "")
    table = Table(title=f"verify step, target whole vs over {config.ranks} ranks, "
                  f"{config.dtype}, ms per step\n{where}\nflags: {flags}")
    columns = list(results[0].cells)
    table.add_column("shape")
    for column in columns:
        table.add_column(column, justify="right")
    table.add_column("split / whole (invariant, all cores)", justify="right")
    table.add_column("bytes summed per step", justify="right")
    for row in results:
        ratio = row.cells["split invariant"] / row.cells["whole invariant, all cores"]
        table.add_row(row.shape, *[f"{row.cells[c]:.2f}" for c in columns], f"{ratio:.2f}x",
                      f"{row.sums} x {row.sum_bytes // 1024} KiB = "
                      f"{row.sums * row.sum_bytes / 1024:.0f} KiB")
    return table


class TpSettings(BaseModel):
    """The verify engine's step with the target whole and split over ranks (tensor
    parallelism on this machine's cores), and what the sums over the ranks cost alone."""

    target: Path | None = Field(None, description="Model folder (default: the tiny target; "
                                "its heads must divide by --ranks).")
    ranks: int = Field(TpBenchConfig.ranks, ge=2, description="Ranks to split the target "
                       "over.")
    dtype: Literal["float32", "bfloat16"] = Field(TpBenchConfig.dtype, description="float32 "
                                                  "or bfloat16.")
    repeats: int = Field(TpBenchConfig.repeats, ge=1, description="Timed calls per cell after "
                         "a warm-up (the median is reported).")
    rows: str = Field(comma_list(TpBenchConfig.rows), pattern=COMMA_LIST, description="The N "
                      "rows x 1 token shapes.")
    drafts: str = Field(comma_list(TpBenchConfig.drafts), pattern=COMMA_LIST,
                        description="The one-row drafts.")
    prefill: int = Field(TpBenchConfig.prefill, ge=0, description="Prefill tokens (0: none).")
    context: int = Field(TpBenchConfig.context, ge=1, description="Cached tokens per row.")
    out: Path = Field(TpBenchConfig.out, description="Where tp.json goes.")
    random_weights: bool = Field(TpBenchConfig.random_weights, description="--target is a "
                                 "folder with a config.json (or llama3-8b): every rank builds "
                                 "it with the same random weights.")
    device: str = Field(TpBenchConfig.device, description="cpu, or cuda: one GPU per rank "
                        "(NCCL).")

    @model_validator(mode="after")
    def _splits(self) -> TpSettings:
        """The target's heads divide by the ranks (a TensorParallelError is a ValueError)."""
        check_split(str(self.folder()), self.ranks, self.random_weights)
        return self

    def folder(self) -> Path:
        return default_target(self.target, "tiny")


def run(settings: TpSettings) -> None:
    """Time every shape whole and split, print the table and write tp.json."""
    s = settings
    config = TpBenchConfig(s.folder(), s.ranks, s.dtype, s.repeats, int_list(s.rows),
                           int_list(s.drafts), s.prefill, s.context, s.out, s.random_weights,
                           s.device)
    console = Console()
    results = run_tp_bench(config, console)
    console.print(report(config, results))
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / "tp.json").write_text(json.dumps(
        {"config": {k: str(v) for k, v in asdict(config).items()}, "machine": machine(),
         "rows": [asdict(r) for r in results]}, indent=1))


if __name__ == "__main__":
    settings_command(TpSettings, run)()
