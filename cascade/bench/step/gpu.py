"""Target-only vs speculative decoding in one process, on a device (``--device cuda``): Cascade's
core loop (``cascade.bench.compare.inprocess.core_trace``) on a target/drafter pair, greedy.

    cascade bench gpu [--target DIR --drafter DIR] [--device cuda] [--k 4] [--max-tokens 64]
                      [--prompts-per-domain 2] [--repeats 3] [--out FILE]

Without folders the tiny pair (``cascade.tools.tiny_models``: random weights) is built into a
temporary folder. Both methods decode every prompt ``repeats`` times after one warm-up
generation; no stop token ends a generation early, so every one yields ``max_tokens`` tokens.
tokens/s = all tokens / all seconds. Greedy speculative decoding must give the target-only
tokens: ``same_tokens`` says whether it did (a float difference between a pass of one token and
a pass of k + 1 can flip a near-tie on a GPU).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, DirectoryPath, Field

from cascade.bench.output import write_json
from cascade.bench.step.device import device_name
from cascade.bench.compare.inprocess import core_trace
from cascade.bench.measure import Trace
from cascade.bench.prompts import BenchPrompt, bench_prompts
from cascade.bench.machine import machine
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.protocol.settings import SamplingParams
from cascade.serving.settings_cli import settings_command


@dataclass(frozen=True)
class MethodSpeed:
    """One method over every prompt and repeat."""

    name: str
    k: int
    tokens: int
    seconds: float
    mean_acceptance_length: float
    """Tokens per target pass (1 for target-only)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def decode_all(target: ModelRunner, drafter: ModelRunner, prompts: list[BenchPrompt],
               params: SamplingParams, k: int, repeats: int) -> list[Trace]:
    """Every prompt ``repeats`` times through the core loop (k = 0: target only)."""
    return [core_trace(target, drafter, p, params, k) for _ in range(repeats) for p in prompts]


def speed(name: str, k: int, traces: list[Trace]) -> MethodSpeed:
    tokens = sum(len(t.tokens) for t in traces)
    passes = sum(t.passes for t in traces)
    return MethodSpeed(name, k, tokens, sum(t.elapsed_s for t in traces), tokens / passes)


def compare(target: ModelRunner, drafter: ModelRunner, prompts: list[BenchPrompt], k: int,
            max_tokens: int, repeats: int) -> dict:
    """Target-only and speculative (k) speeds, their ratio, and whether they agree."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_tokens)
    with torch.inference_mode():
        core_trace(target, drafter, prompts[0], params, k)  # warm-up: kernels, allocator
        alone = decode_all(target, drafter, prompts, params, 0, repeats)
        spec = decode_all(target, drafter, prompts, params, k, repeats)
    methods = [speed("target only", 0, alone), speed(f"speculative (k={k})", k, spec)]
    return {"methods": [asdict(m) | {"tokens_per_s": m.tokens_per_s} for m in methods],
            "speedup": methods[1].tokens_per_s / methods[0].tokens_per_s,
            "same_tokens": [t.tokens for t in alone] == [t.tokens for t in spec]}


def measure(target: Path, drafter: Path, device: str, k: int, max_tokens: int,
            per_domain: int, repeats: int) -> dict:
    """Load the pair on ``device`` and ``compare``; the result with its context."""
    runners = [ModelRunner.load(ModelSpec(str(f), device=device)) for f in (target, drafter)]
    prompts = bench_prompts(runners[0].tokenizer, per_domain)
    result = compare(*runners, prompts, k, max_tokens, repeats)
    return {"device": device, "gpu": device_name(device), "machine": machine(),
            "target": str(target), "drafter": str(drafter), "k": k, "max_tokens": max_tokens,
            "prompts": len(prompts), "repeats": repeats} | result


def report(result: dict) -> str:
    lines = [f"{result['gpu'] or result['machine']} ({result['device']}): "
             f"{result['prompts']} prompts x {result['repeats']} x {result['max_tokens']} "
             "tokens, greedy"]
    for m in result["methods"]:
        lines.append(f"{m['name']:<20} {m['tokens_per_s']:9.1f} tokens/s  "
                     f"{m['mean_acceptance_length']:.2f} tokens/pass")
    lines.append(f"speculative / target only: {result['speedup']:.2f}x; same tokens: "
                 f"{result['same_tokens']}")
    return "\n".join(lines)


class GpuSettings(BaseModel):
    """Target-only vs speculative tokens/s in one process, greedy, on a device (the tiny
    random-weight pair unless both folders are given)."""

    target: DirectoryPath | None = Field(None, description="Target model folder (default: the "
                                         "tiny pair, built into a temporary folder).")
    drafter: DirectoryPath | None = Field(None, description="Drafter model folder (default: "
                                          "the tiny pair's).")
    device: str = Field("cpu", description="cpu or cuda[:N].")
    k: int = Field(4, ge=1, le=32, description="Drafted tokens per round.")
    max_tokens: int = Field(64, ge=1, description="Tokens generated per prompt.")
    prompts_per_domain: int = Field(2, ge=1, le=4, description="Prompts from each of prose, "
                                    "chat, code.")
    repeats: int = Field(3, ge=1, description="Runs of every prompt per method, after one "
                         "warm-up generation.")
    out: Path | None = Field(None, description="Also write the result to this JSON file.")


def run(settings: GpuSettings) -> None:
    """Measure both methods on the pair, print the report and write the JSON file if asked."""
    s = settings
    with tempfile.TemporaryDirectory(prefix="cascade-pair-") as folder:
        target, drafter = s.target, s.drafter
        if target is None or drafter is None:
            from cascade.tools.tiny_models import build_tiny_pair

            target, drafter = build_tiny_pair(Path(folder))
        result = measure(target, drafter, s.device, s.k, s.max_tokens, s.prompts_per_domain,
                         s.repeats)
    print(report(result), flush=True)
    write_json(s.out, result)


if __name__ == "__main__":
    settings_command(GpuSettings, run)()
