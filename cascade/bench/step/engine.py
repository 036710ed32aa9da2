"""``cascade bench engine``: the verify engine's step beside what a user would run instead, on
the same shapes, in float32 and bfloat16.

    cascade bench engine [--target DIR] [--dtype float32 --dtype bfloat16] [--repeats 5]
                         [--context 100] [--threads N] [--no-hf-compile] [--out DIR]
                         [--device cuda] [--random-weights] [--rows 1,4,16,32]
                         [--drafts 4,8,16] [--no-tree] [--prefill 512]
    python -m cascade.bench.step.engine [the same options]

``--device cuda``: models, caches and inputs on the GPU, every timing fenced by
``torch.cuda.synchronize``; the bandwidth limit then uses the GPU's memory bandwidth (a
device-to-device copy, bytes read plus written) and the header names the GPU.
``--random-weights``: ``--target`` is a folder holding only a ``config.json``, or ``llama3-8b``;
one model with random weights, built on the device, serves the engine and transformers
(``cascade.bench.step.device``).

Shapes: N rows of one token; one row of a draft + its pending token; a 16-node token tree;
a prefill. Every row but the prefill's holds ``context`` cached tokens at every call (caches
set back untimed). Each cell is the median of ``repeats`` calls after a warm-up, ms per step:

- engine plain and engine invariant: ``VerifyEngine.step`` with ``invariant=False`` / ``True``,
  acceptance and commit included; the prefill a fresh sequence each call, closed afterwards;
- transformers eager: the plain model (not the engine's), a ``DynamicCache`` holding the
  context of every row, one forward of the step's tokens with an attention mask and
  ``logits_to_keep`` covering them (the tree fed as a chain of as many tokens; the prefill one
  forward over its tokens, no cache before it);
- transformers compiled: a ``StaticCache`` and ``torch.compile(model, dynamic=True)``, four
  graphs per dtype (a minute or two each on two cores); a failed compile leaves the column
  empty (``compile_error``);
- torch floor: every weight product of the model alone, ``F.linear(x, W)`` over the step's
  tokens (rows x tokens; GPT-2's ``Conv1D``: x @ W), the output head over the positions whose
  logits the step keeps, summed;
- bandwidth limit: the bytes of those weights / the memory read bandwidth measured here
  (``cascade.bench.step.device``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from pydantic import BaseModel, Field, model_validator

from cascade.bench.step.columns import CompiledColumn, floor_prepare, hf_prepare, weight_bytes
from cascade.bench.step.device import (cpu_flags, device_name, is_cuda, load_models,
                                       memory_bandwidth, synchronizer)
from cascade.bench.step.report import (DtypeResult, EngineBenchResult, Shape, ShapeResult,
                                         bandwidth_label, header, save, table)
from cascade.bench.step.rows import EngineRows
from cascade.bench.step.timing import Counter, OnProgress, interleaved, set_up
from cascade.bench.machine import machine
from cascade.core.verify import compiled
from cascade.serving.settings_cli import settings_command

BENCH_DTYPES = ("float32", "bfloat16")
TREE_PARENTS = (-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6)
"""A 16-node tree: two root children, each node two children, breadth first (depth 4)."""
NEW_TOKENS = 32
"""max_new_tokens of the engine's sequences, at least (``EngineBenchConfig.new_tokens``)."""
COLUMNS = ("plain", "invariant", "eager", "compiled", "floor")
COMMA_LIST = r"^\d+(,\d+)*$"


def default_threads() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class EngineBenchConfig:
    """What ``run_engine_bench`` measures."""

    target: Path
    dtypes: tuple[str, ...] = BENCH_DTYPES
    threads: int = field(default_factory=default_threads)
    repeats: int = 5
    context: int = 100
    """Cached tokens per row."""
    hf_compile: bool = True
    out: Path = Path("runs/bench-engine")
    rows: tuple[int, ...] = (1, 4, 16, 32)
    drafts: tuple[int, ...] = (4, 8, 16)
    tree: tuple[int, ...] = TREE_PARENTS
    """The tree shape's parents (empty: no tree shape)."""
    prefill: int = 512
    """The prefill shape's tokens (0: none)."""
    bandwidth_mib: int = 0
    """Size of the bandwidth probe's tensor (0: four times the largest cache, at least 1 GiB;
    on a GPU 4 GiB)."""
    device: str = "cpu"
    """Where the models, caches and inputs live (cpu, cuda, cuda:1, ...)."""
    random_weights: bool = False
    """``target`` is a config (a folder's config.json, or a built-in name): random weights."""
    engine_compile: bool = True
    """Also time the engine's step compiled (``cascade.core.verify.compiled``; minutes)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.dtypes) - set(BENCH_DTYPES))
        if unknown or not self.dtypes:
            raise ValueError(f"dtypes must be among {BENCH_DTYPES}, got {list(self.dtypes)}")
        if min(self.repeats, self.context, self.threads) < 1:
            raise ValueError("repeats, context and threads must be at least 1")
        if not self.rows or min(self.rows + self.drafts) < 1 or self.prefill < 0:
            raise ValueError("rows (at least one) and drafts must be at least 1, prefill 0 "
                             "or more")
        if is_cuda(self.device) and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: torch sees no CUDA device")

    @property
    def new_tokens(self) -> int:
        """max_new_tokens of the engine's sequences: room for the longest draft or tree."""
        return max(NEW_TOKENS, max(self.drafts, default=0) + 4, len(self.tree) + 4)

    def shapes(self) -> list[Shape]:
        shapes = [Shape(f"{n} row{'s' if n > 1 else ''} x 1", n, 1) for n in self.rows]
        shapes += [Shape(f"1 row x {k + 1} (draft {k})", 1, k + 1) for k in self.drafts]
        if self.tree:
            nodes = len(self.tree)
            shapes.append(Shape(f"1 row x {nodes + 1} (tree {nodes})", 1, nodes + 1,
                                tuple(self.tree)))
        if self.prefill:
            shapes.append(Shape(f"prefill {self.prefill}", 1, self.prefill, prefill=True))
        return shapes


def _measure_shape(shape: Shape, engines: dict[str, EngineRows], model, compiled: CompiledColumn,
                   config: EngineBenchConfig, note: Callable[[str], None],
                   errors: dict[str, str]) -> ShapeResult:
    """Every column of one shape but the bandwidth limit (``bandwidth_ms`` is left 0); the
    engine, eager and floor columns interleaved (``timing.interleaved``). A column that fails is
    left empty for this shape (its first error kept in ``errors``)."""
    note(", ".join(f"engine {name}" for name in engines) + ", transformers eager, torch floor",
         len(engines) + 2)
    setups = {name: partial(partial, rows.prepare, shape) for name, rows in engines.items()}
    setups["eager"] = partial(hf_prepare, model, model, shape, config.context, False)
    setups["floor"] = partial(floor_prepare, model, shape)
    prepares = set_up(setups, errors)
    cells, _ = interleaved(prepares, config.repeats, synchronizer(config.device), errors)
    for rows in engines.values():
        rows.close_prefill()
    note("transformers compiled")
    compiled_ms, compile_ms = compiled.measure(model, shape, config)
    return ShapeResult(shape, cells.get("plain"), cells.get("invariant"), cells.get("eager"),
                       compiled_ms, cells.get("floor"), 0.0, shape.fed,
                       None if compile_ms is None else compile_ms / 1000,
                       cells.get("plain compiled"), cells.get("invariant compiled"))


def _measure_dtype(dtype: str, config: EngineBenchConfig, bandwidth: float,
                   counter: Counter) -> DtypeResult:
    runner, model = load_models(config, dtype)
    errors: dict[str, str] = {}
    setups = {"plain": partial(EngineRows, runner, False, config),
              "invariant": partial(EngineRows, runner, True, config)}
    if config.engine_compile:
        forward = compiled.compiled_forward(runner.model)
        setups["plain compiled"] = partial(EngineRows, runner, False, config, forward)
        setups["invariant compiled"] = partial(EngineRows, runner, True, config, forward)
    engines = set_up(setups, errors)
    hf_compiled = CompiledColumn(model, config.hf_compile)
    try:
        results = [_measure_shape(shape, engines, model, hf_compiled, config,
                                  counter.note(f"{dtype} {shape.name}"), errors)
                   for shape in config.shapes()]
    finally:
        for name, rows in engines.items():
            set_up({name: rows.close}, errors)
    total_bytes = weight_bytes(model)
    for result in results:
        result.bandwidth_ms = 1000 * total_bytes / bandwidth
        if hf_compiled.error:
            result.compiled_ms = result.compile_s = None
    return DtypeResult(dtype, total_bytes, results, hf_compiled.error, errors)


def run_engine_bench(config: EngineBenchConfig,
                     progress: OnProgress = lambda description, done, total: None
                     ) -> EngineBenchResult:
    """Every shape's cells in every dtype (see the module docstring), on ``config.threads``
    torch threads (the caller's count is restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        progress("memory bandwidth", 0, 1)
        bandwidth = memory_bandwidth(config.device, config.bandwidth_mib << 20)
        counter = Counter(progress, len(config.dtypes) * len(config.shapes())
                           * (len(COLUMNS) + 2 * config.engine_compile))
        dtypes = []
        for dtype in config.dtypes:
            dtypes.append(_measure_dtype(dtype, config, bandwidth, counter))
            if is_cuda(config.device):
                torch.cuda.empty_cache()  # the last dtype's models are gone: room for the next
        progress("done", counter.total, counter.total)
    finally:
        torch.set_num_threads(before)
    return EngineBenchResult(machine(), config.threads, cpu_flags(), bandwidth / 1e9,
                             config.context, config.repeats, str(config.target), dtypes,
                             config.device, device_name(config.device))


def run_on_console(config: EngineBenchConfig, console: Console) -> EngineBenchResult:
    """``run_engine_bench`` with a progress bar, then each dtype's table printed and saved to
    ``config.out``."""
    started = time.perf_counter()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn()]
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("starting", total=None)
        result = run_engine_bench(config, lambda description, done, total: bar.update(
            task, description=description, completed=done, total=total))
    console.print(f"{bandwidth_label(result)} {result.bandwidth_gb_s:.1f} GB/s; the run took "
                  f"{time.perf_counter() - started:.0f} s")
    for dtype in result.dtypes:
        console.print(f"\n{header(result, dtype)}\n\n{table(dtype)}", markup=False,
                      highlight=False, soft_wrap=True)
    for path in save(result, config.out):
        console.print(f"wrote {path}")
    return result


def comma_list(values: tuple[int, ...]) -> str:
    """(1, 4, 16) -> ``"1,4,16"``: a comma list option's default."""
    return ",".join(map(str, values))


def int_list(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> (1, 4, 16): a comma list option's value."""
    return tuple(int(part) for part in text.split(",") if part.strip())


class EngineSettings(BaseModel):
    """The verify engine's step (plain and batch-invariant) beside transformers eager and
    compiled, torch's matmul floor and the memory-bandwidth limit, on rows of one token,
    drafts, a token tree and a prefill, per dtype."""

    target: Path | None = Field(None, description="Model folder (default: the "
                                "SmolLM2-135M-Instruct target); with --random-weights a folder "
                                "with a config.json, or llama3-8b.")
    dtype: list[Literal["float32", "bfloat16"]] = Field(
        list(EngineBenchConfig.dtypes), description="float32 or bfloat16 (repeat the flag).")
    threads: int = Field(default_factory=default_threads, ge=1, description="torch threads "
                         "(default: all cores).")
    repeats: int = Field(EngineBenchConfig.repeats, ge=1, description="Timed calls per cell "
                         "after a warm-up (the median is reported).")
    context: int = Field(EngineBenchConfig.context, ge=1, description="Cached tokens per row.")
    hf_compile: bool = Field(EngineBenchConfig.hf_compile, description="Also time transformers "
                             "with a static cache under torch.compile (compiles for minutes).")
    engine_compile: bool = Field(EngineBenchConfig.engine_compile, description="Also time the "
                                 "engine's step compiled (--compile on; compiles for minutes).")
    out: Path = Field(EngineBenchConfig.out, description="Where engine.json and table.md go.")
    device: str = Field(EngineBenchConfig.device, description="cpu or cuda[:N].")
    random_weights: bool = Field(EngineBenchConfig.random_weights, description="Build the "
                                 "target from its config with random weights, on the device.")
    rows: str = Field(comma_list(EngineBenchConfig.rows), pattern=COMMA_LIST,
                      description="The N rows x 1 token shapes, a comma list.")
    drafts: str = Field(comma_list(EngineBenchConfig.drafts), pattern=COMMA_LIST,
                        description="The one-row drafts (passes of draft + 1 tokens), a comma "
                        "list.")
    tree: bool = Field(bool(EngineBenchConfig.tree), description="The 16-node token tree "
                       "shape.")
    prefill: int = Field(EngineBenchConfig.prefill, ge=0, description="Prefill tokens (0: "
                         "none).")
    bandwidth_mib: int = Field(EngineBenchConfig.bandwidth_mib, ge=0, description="The "
                               "bandwidth probe's tensor in MiB (0: the device's default).")

    @model_validator(mode="after")
    def _a_folder(self) -> EngineSettings:
        if self.target and not self.random_weights and not self.target.is_dir():
            raise ValueError(f"--target {self.target} is not a model folder")
        return self

    def config(self, target: Path) -> EngineBenchConfig:
        return EngineBenchConfig(
            target, tuple(self.dtype), self.threads, self.repeats, self.context,
            self.hf_compile, self.out, int_list(self.rows), int_list(self.drafts),
            TREE_PARENTS if self.tree else (), self.prefill, self.bandwidth_mib, self.device,
            self.random_weights, self.engine_compile)


def run(settings: EngineSettings) -> EngineBenchResult:
    """Measure every shape and column, print and save the tables."""
    from cascade.tools.pairs import default_target

    target = default_target(settings.target)
    return run_on_console(settings.config(target), Console())


if __name__ == "__main__":
    settings_command(EngineSettings, run)()
