"""n choices of one prompt on the verifier, with the prompt computed once (shared prefixes) and
with every choice computing it, side by side.

    cascade bench shared-prefill [--target DIR] [--prompt-tokens 512] [--n 4]
        [--max-tokens 16] [--repeats 3]

Each choice is a session of its own decoded by the target alone through the verifier's
scheduler (the rows of one engine step are batched, as on the pod). Prints, per mode, the time
until every choice has its first token and until every choice is done (medians of the repeats,
modes alternated), and the ratios.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from pydantic import BaseModel, Field

from cascade.bench.compare.run import machine
from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from cascade.serving.settings_cli import settings_command
from verifier_service.scheduler import StepScheduler, VerifierSettings


async def _choices(engine: VerifyEngine, prompt: list[int], n: int, max_tokens: int
                   ) -> tuple[float, float]:
    """Seconds until every choice has its first token, and until all are done."""
    scheduler = StepScheduler(engine, ThreadPoolExecutor(1), VerifierSettings())
    params = SamplingParams(max_new_tokens=max_tokens)
    sequences = [SequenceVerifier(engine.runner, prompt, params, engine=engine) for _ in range(n)]
    started, firsts = time.perf_counter(), []

    async def decode(sequence):
        await scheduler.submit(sequence, Draft([]))
        firsts.append(time.perf_counter() - started)
        while not sequence.is_finished:
            await scheduler.submit(sequence, Draft([]))

    await asyncio.gather(*(decode(s) for s in sequences))
    total = time.perf_counter() - started
    for s in sequences:
        s.close()
    return max(firsts), total


def measure(runner: ModelRunner, prompt_tokens: int, n: int, max_tokens: int, repeats: int
            ) -> dict[bool, list[tuple[float, float]]]:
    def prompt(run: int) -> list[int]:  # one per run: ended runs' cached blocks never help
        return [(7 * i + 11 + 101 * run) % runner.vocab_size for i in range(prompt_tokens)]

    engines = {share: VerifyEngine(runner, kv_tokens=n * (prompt_tokens + max_tokens + 128),
                                   share_prefixes=share) for share in (True, False)}
    asyncio.run(_choices(engines[False], prompt(0)[:32], 1, 2))  # warm up
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for repeat in range(repeats):
        for share, engine in engines.items():
            runs[share].append(asyncio.run(_choices(engine, prompt(1 + repeat), n, max_tokens)))
    return runs


class SharedPrefillSettings(BaseModel):
    """n choices of one prompt on the verifier, the prompt computed once and by every choice:
    the time until every choice has its first token and until all are done."""

    target: Path | None = Field(None, description="Target model folder (default: "
                                "SmolLM2-135M-Instruct).")
    prompt_tokens: int = Field(512, ge=1, description="Tokens in the prompt.")
    n: int = Field(4, ge=1, description="Choices of the prompt.")
    max_tokens: int = Field(16, ge=1, description="Tokens each choice generates.")
    repeats: int = Field(3, ge=1, description="Runs per mode, modes alternated (medians "
                         "reported).")


def run(settings: SharedPrefillSettings) -> None:
    """Measure both modes and print the table."""
    from cascade.tools.pairs import default_target

    s = settings
    target = default_target(s.target)
    runner = ModelRunner.load(ModelSpec(str(target)))
    runs = measure(runner, s.prompt_tokens, s.n, s.max_tokens, s.repeats)
    first = {share: statistics.median(r[0] for r in runs[share]) for share in runs}
    done = {share: statistics.median(r[1] for r in runs[share]) for share in runs}
    print(f"{machine()}, {torch.get_num_threads()} torch threads, n = {s.n}, "
          f"{s.prompt_tokens}-token prompt, {s.max_tokens} tokens each, target alone")
    print("| prefill | every first token (s) | every choice done (s) |")
    print("|---|---|---|")
    for share, name in ((False, "every choice computes the prompt"), (True, "computed once")):
        print(f"| {name} | {first[share]:.2f} | {done[share]:.2f} |")
    print(f"| ratio | {first[False] / first[True]:.2f}x | {done[False] / done[True]:.2f}x |")


if __name__ == "__main__":
    settings_command(SharedPrefillSettings, run)()
