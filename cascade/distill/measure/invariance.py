"""The batch-invariant pass against the plain one, side by side in one run: exactness and cost
(with the distillation's held-out prompts, hence here).

    cascade bench invariance [--target DIR --drafter DIR | --pair smollm2] [--dtype auto]
        [--prompts 24] [--tokens 64] [--parts exactness --parts cost] [--out FILE]

Exactness: held-out prompts (never used to distil the drafter), greedy. For each kind of pass,
the reference is that pass's own one-token decoding (k = 0); speculation with k = 1 and k = 4
runs on one stream, and inside batches of 8 sessions of different prompts, lengths and k
(1 .. 8) that share every pass. Cost: milliseconds per pass of 1 and 16 sessions, k = 0 and
k = 4, the two kinds alternating, median of 7.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field

from cascade.bench.output import write_section
from cascade.bench.prompts import encode
from cascade.bench.compare.run import machine
from cascade.core.blocks import Draft
from cascade.core.model.dtypes import cpu_flags
from cascade.core.verify.engine import VerifyEngine
from cascade.core.loop import _proposer
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.verify.verification import SequenceVerifier
from cascade.distill.prompts import prompt_set
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy
from cascade.serving.settings_cli import settings_command
from cascade.tools.pairs import PairSettings

BATCH = 8
MARKER = "<!-- cascade.distill.measure.invariance -->"
PASSES = {"plain": False, "invariant": True}


def run_batch(engine: VerifyEngine, drafter: ModelRunner, prompts: list[list[int]],
              ks: list[int], tokens: int) -> list[list[int]]:
    """Greedy generations of ``prompts`` (k per session), every round of the live sessions
    verified in one engine step."""
    params = SamplingParams(max_new_tokens=tokens)
    sessions = []
    for prompt, k in zip(prompts, ks):
        config = DraftConfig(num_draft_tokens=k, method="model")
        policy = AcceptancePolicy.default_for(params, config)
        sessions.append((SequenceVerifier(engine.runner, prompt, params, policy=policy,
                                          engine=engine),
                         _proposer(drafter, params, config, policy, len(prompt), None), config))
    while live := [s for s in sessions if not s[0].is_finished]:
        engine.step([(verifier, _draft(verifier, proposer, config, params))
                     for verifier, proposer, config in live])
    outputs = [verifier.generated for verifier, _, _ in sessions]
    for verifier, _, _ in sessions:
        verifier.close()
    return outputs


def _draft(verifier, proposer, config, params) -> Draft:
    if proposer is None:
        return Draft([])
    return proposer.propose(verifier.committed, config.budget(params, len(verifier.generated)))


def exactness(engine, drafter, prompts, tokens) -> dict[str, int]:
    """Prompts whose speculative greedy output equals this pass's k = 0 output, per setting."""
    reference = [run_batch(engine, drafter, [p], [0], tokens)[0] for p in prompts]
    equal = {}
    for k in (1, 4):
        outputs = [run_batch(engine, drafter, [p], [k], tokens)[0] for p in prompts]
        equal[f"one stream, k = {k}"] = sum(a == b for a, b in zip(outputs, reference))
    batched = []
    for start in range(0, len(prompts), BATCH):
        group = prompts[start : start + BATCH]
        batched += run_batch(engine, drafter, group, [1 + i % 8 for i in range(len(group))],
                             tokens)
    equal[f"batch of {BATCH}, k = 1 .. 8"] = sum(a == b for a, b in zip(batched, reference))
    return equal


def pass_ms(engines: dict[str, VerifyEngine], sessions: int, k: int,
            repeats: int = 7) -> dict[str, float]:
    """Median milliseconds per step of ``sessions`` rows drafting k tokens each (200-token
    contexts), the kinds of pass alternating."""
    params = SamplingParams(max_new_tokens=600)
    rows = {name: [SequenceVerifier(e.runner, list(range(100 + i, 300 + i)), params, engine=e)
                   for i in range(sessions)] for name, e in engines.items()}
    times: dict[str, list[float]] = {name: [] for name in engines}
    for name, engine in engines.items():
        engine.step([(s, Draft([])) for s in rows[name]])  # prefill
    for _ in range(repeats + 1):
        for name, engine in engines.items():
            started = time.perf_counter()
            engine.step([(s, Draft([1] * k)) for s in rows[name]])
            times[name].append(time.perf_counter() - started)
    for sequences in rows.values():
        for s in sequences:
            s.close()
    return {name: statistics.median(t[1:]) * 1e3 for name, t in times.items()}


def report(target: ModelRunner, drafter: ModelRunner, prompts, tokens: int,
           parts: tuple[str, ...] = ("exactness", "cost")) -> list[str]:
    engines = {name: VerifyEngine(target, kv_tokens=64 * 1024, invariant=flag)
               for name, flag in PASSES.items()}
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    lines = [f"{machine()}; flags {', '.join(flags) or 'none listed'}; {dtype}; "
             f"rules {engines['invariant'].invariance}"]
    if "exactness" in parts:
        lines += _exactness_table(engines, drafter, prompts, tokens)
    if "cost" in parts:
        lines += _cost_table(engines)
    return lines


def _exactness_table(engines, drafter, prompts, tokens) -> list[str]:
    lines = ["", f"Greedy output equal to the pass's own k = 0 output ({len(prompts)} held-out "
             f"prompts x {tokens} tokens):", "",
             "| setting | plain pass | invariant pass |", "|---|---|---|"]
    results = {name: exactness(e, drafter, prompts, tokens) for name, e in engines.items()}
    for setting in results["plain"]:
        lines.append(f"| {setting} | {results['plain'][setting]}/{len(prompts)} | "
                     f"{results['invariant'][setting]}/{len(prompts)} |")
    return lines


def _cost_table(engines) -> list[str]:
    lines = ["", "Milliseconds per pass (median of 7, alternating):", "",
             "| sessions | k | plain | invariant | invariant / plain |", "|---|---|---|---|---|"]
    for sessions in (1, 16):
        for k in (0, 4):
            ms = pass_ms(engines, sessions, k)
            lines.append(f"| {sessions} | {k} | {ms['plain']:.1f} | {ms['invariant']:.1f} | "
                         f"{ms['invariant'] / ms['plain']:.2f} |")
    return lines


class InvarianceSettings(BaseModel):
    """The batch-invariant pass against the plain one: exactness on held-out prompts, and
    milliseconds per pass of 1 and 16 sessions."""

    models: PairSettings = PairSettings()
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The target's dtype (the drafter runs in the same): auto, float32, "
        "bfloat16 or float16.")
    prompts: int = Field(24, ge=1, description="Held-out prompts of the exactness tables.")
    tokens: int = Field(64, ge=1, description="Tokens generated per prompt.")
    parts: list[Literal["exactness", "cost"]] = Field(
        ["exactness", "cost"], min_length=1, description="Tables to measure (repeat the flag): "
        "exactness, cost.")
    out: Path | None = Field(None, description="Write the tables to this markdown file too "
                             "(their own section, replaced on every run).")


def run(settings: InvarianceSettings) -> None:
    """Load the pair, measure the parts asked for, print the tables (and write them)."""
    s = settings
    target_dir, drafter_dir = s.models.folders()  # a folder given alone replaces the pair's
    target_dir, drafter_dir = s.models.target or target_dir, s.models.drafter or drafter_dir
    target = ModelRunner.load(ModelSpec(str(target_dir), s.dtype))
    drafter = ModelRunner.load(ModelSpec(str(drafter_dir),
                                         str(target.model.dtype).removeprefix("torch.")))
    prompts = [encode(target.tokenizer, text, True)
               for text in prompt_set(held_out=True)[: s.prompts]]
    with torch.inference_mode():
        lines = report(target, drafter, prompts, s.tokens, tuple(s.parts))
    print("\n".join(lines))
    if s.out:
        write_section(s.out, MARKER, "\n".join(lines) + "\n")


if __name__ == "__main__":
    settings_command(InvarianceSettings, run)()
