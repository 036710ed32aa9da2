"""``cascade bench cascades``: the speculative cascade rules over alpha against lossless
speculative decoding and a classic cascade, in one process (``cascade.bench.drafting.
cascades_eval``) and on a local cluster (``cascades_services``), then the table and plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field, model_validator
from rich.console import Console

from cascade.bench.drafting import cascades_eval as ev
from cascade.bench.machine import machine
from cascade.bench.prompts import bench_prompts
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import SamplingParams
from cascade.serving.settings_cli import aliases, settings_command
from cascade.tools.pairs import PairSettings

Rule = Literal["chow", "diff", "opt", "token_v1", "token_v2", "token_v3"]


class CascadesSettings(BaseModel):
    """Quality vs cost of the speculative cascade rules over alpha, beside lossless speculative
    decoding and a classic cascade (greedy; in one process, and on a local cluster unless
    --no-services)."""

    models: PairSettings = PairSettings()
    num_draft_tokens: int = Field(4, ge=1, le=32, description="Drafted tokens per round.",
                                  json_schema_extra=aliases("--k"))
    max_tokens: int = Field(48, ge=1, description="Tokens per prompt.")
    prompts_per_domain: int = Field(2, ge=1, le=4, description="Prompts from each of prose, "
                                    "chat, code.")
    rule: list[Rule] = Field(list(ev.RULES), min_length=1, description="Cascade rules to sweep "
                             "(repeat the flag).")
    alpha: list[float] = Field([0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0], min_length=1,
                               description="Alphas to sweep, each in [0, 1] (repeat the flag).")
    threads: int = Field(2, ge=1, description="torch threads.")
    services: bool = Field(True, description="Also run every speculative method on a local "
                           "cluster (tokens/s on the services, same tokens as in one process).")
    out: Path = Field(Path("runs/bench-cascades"), description="Where cascades.json, "
                      "cascades.md and cascades.png go.")

    @model_validator(mode="after")
    def _alphas(self) -> CascadesSettings:
        if not all(0.0 <= a <= 1.0 for a in self.alpha):
            raise ValueError(f"--alpha must be in [0, 1], got {self.alpha}")
        return self


def run(settings: CascadesSettings) -> None:
    """Score every method in one process (and on the services), print and save the table."""
    s, console = settings, Console()
    torch.set_num_threads(s.threads)
    target, drafter = s.models.folders(console.print)
    target_runner, drafter_runner = (ModelRunner.load(ModelSpec(str(f))) for f in (target,
                                                                                    drafter))
    prompts = bench_prompts(target_runner.tokenizer, s.prompts_per_domain)
    eos = target_runner.tokenizer.eos_token_id
    params = SamplingParams(temperature=0.0, max_new_tokens=s.max_tokens,
                            stop_token_ids=() if eos is None else (eos,))
    chosen = ev.methods(tuple(s.rule), tuple(s.alpha))
    console.print(f"{len(chosen)} methods x {len(prompts)} prompts, {machine()}")
    scores = list(ev.evaluate(target_runner, drafter_runner, prompts, params,
                              s.num_draft_tokens, chosen, lambda score: _progress(console, score)))
    rows = [score.row() for score in scores]
    if s.services:
        from cascade.bench.drafting.cascades_services import run_on_services

        del target_runner, drafter_runner  # the cluster's pods load their own copies
        speculative = [score.method for score in scores if score.method.name != "classic"]
        runs = run_on_services(target, drafter, prompts, s.num_draft_tokens, s.max_tokens,
                               speculative, s.out, lambda m, r: console.print(
                                   f"services {m.name} {m.knob}: {r.tokens_per_s} tokens/s"))
        ev.add_services(rows, scores, runs)
    _save(s, rows, len(prompts), target, drafter)
    console.print(ev.rows_markdown(rows))
    console.print(f"wrote {s.out}/cascades.json, cascades.md, cascades.png")


def _progress(console: Console, score: ev.Score) -> None:
    row = score.row()
    console.print(f"{row['method']:>9} {row['knob']:<5} passes/token "
                  f"{row['passes_per_token']:.3f}  {row['tokens_per_s']:>6} tokens/s  "
                  f"log-lik {row['mean_log_likelihood']:.3f}  argmax "
                  f"{row['target_argmax_fraction']:.3f}")


def _save(s: CascadesSettings, rows: list[dict], num_prompts: int, target: Path,
          drafter: Path) -> None:
    s.out.mkdir(parents=True, exist_ok=True)
    context = {"machine": machine(), "k": s.num_draft_tokens, "max_tokens": s.max_tokens,
               "prompts": num_prompts, "target": str(target.name), "drafter": str(drafter.name)}
    (s.out / "cascades.json").write_text(json.dumps({"context": context, "rows": rows},
                                                    indent=1))
    (s.out / "cascades.md").write_text(ev.rows_markdown(rows))
    ev.plot(rows, s.out / "cascades.png", f"greedy, k={s.num_draft_tokens}, {num_prompts} "
            f"prompts x {s.max_tokens} tokens")


if __name__ == "__main__":
    settings_command(CascadesSettings, run)()
