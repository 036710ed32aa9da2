"""``cascade bench load``'s flags and what it runs: the sweep (``cascade.bench.load.sweep``),
its progress line per point, then the tables and files (``cascade.bench.load.report``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from rich.console import Console

from cascade.bench.load.report import comparison, save, table
from cascade.bench.load.sweep import LoadConfig, Point, run_load
from cascade.serving.settings_cli import aliases
from cascade.tools.pairs import PairSettings


class LoadSettings(BaseModel):
    """The verifier under 1..32 concurrent streaming sessions: speculative unbatched and
    batched, target-only batched, fixed k, the auto schedule and token trees, side by side in
    one run."""

    models: PairSettings = PairSettings()
    num_draft_tokens: int = Field(LoadConfig.k, ge=1, le=32, json_schema_extra=aliases("--k"),
                                  description="Drafted tokens per round.")
    sessions: list[int] = Field(list(LoadConfig.sessions), description="Concurrent clients "
                                "(repeat the flag).")
    max_tokens: int = Field(LoadConfig.max_tokens, ge=1, description="Tokens per request.")
    window_s: float = Field(LoadConfig.window_s, ge=1, description="Seconds measured per "
                            "point.")
    soak_s: float = Field(LoadConfig.soak_s, ge=0, description="Seconds of the soak run with "
                          "the most sessions (batched speculative mode).")
    max_wait_ms: float | None = Field(None, description="The batched verifiers' --max-wait-ms "
                                      "(default: theirs).")
    only: list[str] = Field([], description="Run only this mode (repeat): unbatched, batched, "
                            "batched-ssd, target-only, fixed-k<n>, auto, default, tree, "
                            "tree-auto, tree-cape, tree-cape-auto (every mode but default "
                            "drafts with the model).")
    fixed_k: list[int] = Field(list(LoadConfig.fixed_k), description="The fixed-k modes beside "
                               "auto (repeat).")
    domain: list[Literal["prose", "chat", "code"]] = Field(
        [], description="Prompt domain the clients send (repeat; prose, chat, code).")
    dtype: Literal["float32", "bfloat16"] = Field(
        LoadConfig.dtype, description="The pods' dtype: float32 or bfloat16 (float32 by "
        "default: the same numbers on every machine; cascade up defaults to auto).")
    tree_nodes: int = Field(LoadConfig.tree_nodes, ge=1, description="Nodes per round of the "
                            "tree mode (depth k).")
    repeats: int = Field(LoadConfig.repeats, ge=1, description="Runs per mode and load, the "
                         "modes taking turns in each: the table pools them, the comparison "
                         "gives each ratio's range over the runs.")
    out: Path = Field(Path("runs/bench-load"), description="Where load.json, load.md and "
                      "load.png go.")

    @model_validator(mode="after")
    def _known_modes(self) -> LoadSettings:
        self.config(Path(), Path()).modes()  # ValueError naming an unknown --only mode
        return self

    def config(self, target: Path, drafter: Path) -> LoadConfig:
        return LoadConfig(target, drafter, self.out, self.num_draft_tokens,
                          tuple(self.sessions), self.max_tokens, self.window_s, self.soak_s,
                          self.max_wait_ms, tuple(self.only), tuple(self.domain), self.dtype,
                          tuple(self.fixed_k), self.tree_nodes, self.repeats)


def run(settings: LoadSettings) -> None:
    """Sweep every mode and load, print each point as it comes, then the tables."""
    console = Console()

    def progress(point: Point) -> None:
        row = point.row()
        repeat = f" (run {row['repeat'] + 1})" if settings.repeats > 1 else ""
        console.print(f"{row['mode']:<32} sessions {row['sessions']:>3}{repeat}: "
                      f"{row['tokens_per_s']:>7} tokens/s, ITL p50 {row['itl_p50_ms']} ms, "
                      f"errors {row['errors']}")

    result = run_load(settings.config(*settings.models.folders(console.print)), progress)
    console.print(table(result))
    console.print(comparison(result))
    for path in save(result, settings.out):
        console.print(f"wrote {path}")
