"""What ``cascade bench engine`` measured (``cascade.bench.step.engine``) and how it is shown: the
results as data, one markdown table per dtype with its ratios, ``engine.json`` and
``table.md``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    """One step's batch: ``rows`` rows of ``tokens`` new tokens each."""

    name: str
    rows: int
    tokens: int
    parents: tuple[int, ...] | None = None
    """The last len(parents) tokens are a token tree's nodes."""
    prefill: bool = False
    """A fresh sequence's whole prompt (no cached context)."""

    @property
    def fed(self) -> int:
        """Tokens the step feeds in all: the floor's rows of x."""
        return self.rows * self.tokens

    @property
    def kept(self) -> int:
        """Positions per row whose logits the step keeps."""
        return 1 if self.prefill else self.tokens

    @property
    def is_rows(self) -> bool:
        """One of the N rows x 1 token shapes."""
        return self.tokens == 1 and not self.prefill


@dataclass
class ShapeResult:
    """One shape's cells, milliseconds per step (None: not measured)."""

    shape: Shape
    plain_ms: float | None
    invariant_ms: float | None
    eager_ms: float | None
    compiled_ms: float | None
    floor_ms: float | None
    bandwidth_ms: float
    floor_tokens: int
    """Rows of x in the floor's products (rows x tokens)."""
    compile_s: float | None = None
    """The compiled column's warm-up call (a compile, where this shape needed a new graph)."""
    plain_compiled_ms: float | None = None
    invariant_compiled_ms: float | None = None
    """The engine's step compiled (``cascade.core.verify.compiled``)."""

    def ratios(self, one_row: ShapeResult | None) -> dict[str, float | None]:
        """The table's ratios; ``one_row``: the 1-row x 1 shape (for the N-row ones)."""
        rows = self.shape.is_rows and one_row is not None
        return {
            "invariant / eager": _ratio(self.invariant_ms, self.eager_ms),
            "plain / eager": _ratio(self.plain_ms, self.eager_ms),
            "invariant / compiled": _ratio(self.invariant_ms, self.compiled_ms),
            "invariant compiled / eager": _ratio(self.invariant_compiled_ms, self.eager_ms),
            "invariant compiled / invariant": _ratio(self.invariant_compiled_ms,
                                                     self.invariant_ms),
            "invariant compiled / plain compiled": _ratio(self.invariant_compiled_ms,
                                                          self.plain_compiled_ms),
            "invariant compiled / floor": _ratio(self.invariant_compiled_ms, self.floor_ms),
            "invariant / plain": _ratio(self.invariant_ms, self.plain_ms),
            "invariant / floor": _ratio(self.invariant_ms, self.floor_ms),
            "invariant / bandwidth": _ratio(self.invariant_ms, self.bandwidth_ms),
            "N / 1 row (invariant)": _ratio(self.invariant_ms, one_row.invariant_ms)
            if rows else None,
            "N / 1 row (invariant compiled)": _ratio(self.invariant_compiled_ms,
                                                     one_row.invariant_compiled_ms)
            if rows else None,
            "N / 1 row (eager)": _ratio(self.eager_ms, one_row.eager_ms) if rows else None,
        }


@dataclass
class DtypeResult:
    """Every shape of one dtype."""

    dtype: str
    weight_bytes: int
    """Bytes of the weights in the floor's products (tied weights once)."""
    shapes: list[ShapeResult]
    compile_error: str | None = None
    """Why the compiled column is empty (None: it compiled, or was not asked for)."""
    column_errors: dict[str, str] = field(default_factory=dict)
    """Columns (plain, invariant, eager, floor) that failed on some shape (left empty there),
    each with its first error."""

    def one_row(self) -> ShapeResult | None:
        return next((r for r in self.shapes if r.shape.is_rows and r.shape.rows == 1), None)


@dataclass
class EngineBenchResult:
    """A whole run: the machine, then every dtype."""

    machine: str
    threads: int
    """torch threads of every cell."""
    cpu_flags: dict[str, bool]
    """avx512_bf16 and amx: whether the CPU has them."""
    bandwidth_gb_s: float
    """The measured memory read bandwidth (bandwidth_ms = weight bytes / it)."""
    context: int
    repeats: int
    target: str
    dtypes: list[DtypeResult]
    device: str = "cpu"
    """Where the models ran (cpu, cuda, ...)."""
    gpu: str | None = None
    """The GPU's name (None on the CPU); bandwidth_gb_s is then its device-to-device copy's,
    bytes read plus written."""


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


TABLE_COLUMNS = ("shape", "tokens", "engine plain", "engine invariant", "engine plain compiled",
                 "engine invariant compiled", "HF eager", "HF compiled", "torch floor",
                 "bandwidth limit")


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value:.3f}"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def bandwidth_label(result: EngineBenchResult) -> str:
    """What ``bandwidth_gb_s`` measured."""
    return "device memory copy (read + written)" if result.gpu else "memory read"


def _where(result: EngineBenchResult) -> str:
    """The GPU (the host beside it), or the CPU with its threads and flags."""
    if result.gpu:
        return f"{result.gpu} ({result.device}); host {result.machine}"
    yes = {True: "yes", False: "no"}
    flags = result.cpu_flags
    return (f"{result.machine}, torch threads: {result.threads}, "
            f"avx512_bf16 {yes[flags['avx512_bf16']]}, AMX {yes[flags['amx']]}")


def header(result: EngineBenchResult, dtype: DtypeResult) -> str:
    """The line above a dtype's table: the CPU, its threads and flags (or the GPU), the
    bandwidth."""
    compile_s = sum(r.compile_s or 0 for r in dtype.shapes)
    compile_note = (f"; compile failed: {dtype.compile_error}" if dtype.compile_error
                    else f"; compiled columns' first calls {compile_s:.0f} s" if compile_s
                    else "")
    failed = "".join(f"; {name} failed: {error}" for name, error in dtype.column_errors.items())
    return (f"**{dtype.dtype}**: {_where(result)}; {bandwidth_label(result)} "
            f"{result.bandwidth_gb_s:.1f} GB/s; {dtype.weight_bytes / 1e6:.1f} MB of weights; "
            f"{result.context} cached tokens per row; ms per step, median of "
            f"{result.repeats}{compile_note}{failed}")


def table(dtype: DtypeResult) -> str:
    """One dtype's markdown table: the cells, then the ratios."""
    one_row = dtype.one_row()
    ratio_names = list(dtype.shapes[0].ratios(one_row)) if dtype.shapes else []
    columns = list(TABLE_COLUMNS) + ratio_names
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in dtype.shapes:
        cells = [r.shape.name, str(r.shape.fed)]
        cells += [_ms(v) for v in (r.plain_ms, r.invariant_ms, r.plain_compiled_ms,
                                   r.invariant_compiled_ms, r.eager_ms, r.compiled_ms,
                                   r.floor_ms, r.bandwidth_ms)]
        cells += [_x(v) for v in r.ratios(one_row).values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(result: EngineBenchResult) -> str:
    """Every dtype's header and table."""
    return "\n".join(f"{header(result, d)}\n\n{table(d)}" for d in result.dtypes)


def to_json(result: EngineBenchResult) -> dict:
    """The result as plain data, each shape with its ratios."""
    data = asdict(result)
    for dtype, raw in zip(result.dtypes, data["dtypes"]):
        one_row = dtype.one_row()
        for shape, row in zip(dtype.shapes, raw["shapes"]):
            row["ratios"] = shape.ratios(one_row)
    return data


def save(result: EngineBenchResult, out: Path) -> list[Path]:
    """``engine.json`` and ``table.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "engine.json", out / "table.md"]
    paths[0].write_text(json.dumps(to_json(result), indent=1))
    paths[1].write_text(markdown(result))
    return paths


