"""How many sessions one KV budget admits: the former rule (each session reserved its prompt
plus max_tokens when it opened) against paged blocks (admission counts the blocks a session
needs now; running sessions grow and, when blocks run out, the latest admitted are preempted),
side by side in one run on the same engine code.

    cascade bench admission [--target DIR] [--sessions 64] [--budget-sessions 8]
        [--prompt-tokens 100] [--max-tokens 1024] [--answer-tokens 100] [--wait-s 600]

Every session arrives at once, asks for ``max_tokens`` and ends after ``answer_tokens`` (its
answer met a stop sequence); each is decoded by the target alone through the verifier's
scheduler and admission (waiting up to ``--wait-s`` for memory, as a verifier does). The budget
is ``budget_sessions`` worst cases (prompt plus max_tokens, in whole blocks). Prints, per rule,
the most sessions open at once, the mean, sessions refused, preemptions, and the wall time.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from pydantic import BaseModel, DirectoryPath, Field

from cascade.bench.compare.run import machine
from cascade.core.blocks import Draft
from cascade.core.verify.engine import KVBudgetExhausted, VerifyEngine
from cascade.core.kv.kv_store import BLOCK_SIZE, blocks_for
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from cascade.serving.errors import Overloaded
from cascade.serving.settings_cli import settings_command
from verifier_service.admission import Admission
from verifier_service.scheduler import StepScheduler, VerifierSettings


class WorstCaseEngine(VerifyEngine):
    """The former admission rule on today's engine: a session is admitted only while the whole
    lives (prompt plus max_tokens) of the open sessions and its own fit the budget."""

    def admit(self, num_positions: int, scope: str = "", now: int | None = None):
        lives = getattr(self, "_lives", {})
        self._lives = lives = {k: v for k, v in lives.items() if not k.closed}
        if sum(lives.values()) + blocks_for(num_positions) > self.store.num_blocks:
            raise KVBudgetExhausted(f"the budget holds no more worst cases "
                                    f"({len(lives)} open)", never_fits=not lives)
        cache = super().admit(num_positions, scope, now)
        lives[cache] = blocks_for(num_positions)
        return cache


async def _serve(engine: VerifyEngine, prompts: list[list[int]], params: SamplingParams,
                 answer: int, wait_s: float) -> dict:
    scheduler = StepScheduler(engine, ThreadPoolExecutor(1), VerifierSettings())
    open_now, samples, refused = [0], [], [0]
    admission = Admission(engine, wait_s, 1.0, lambda: bool(engine.prefixes.live()))

    async def session(prompt: list[int]) -> None:
        try:
            sequence = await admission.admit(
                lambda: SequenceVerifier(engine.runner, prompt, params, engine=engine), "",
                len(prompt) + 1)
        except Overloaded:
            refused[0] += 1
            return
        open_now[0] += 1
        try:
            while len(sequence.generated) < answer and not sequence.is_finished:
                await scheduler.submit(sequence, Draft([]))
                samples.append(open_now[0])
        finally:
            open_now[0] -= 1
            sequence.close()
            await admission.freed()

    started = time.perf_counter()
    await asyncio.gather(*(session(p) for p in prompts))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "tokens_per_s": answer * (len(prompts) - refused[0]) / seconds,
            "peak": max(samples, default=0),
            "mean": sum(samples) / max(len(samples), 1), "refused": refused[0],
            "preemptions": engine.preemptions}


def measure(runner: ModelRunner, sessions: int, budget_sessions: int, prompt_tokens: int,
            max_tokens: int, answer: int, wait_s: float) -> dict[str, dict]:
    prompts = [[(7 * i + 13 * s + 11) % runner.vocab_size for i in range(prompt_tokens)]
               for s in range(sessions)]  # no two share a prefix
    budget = budget_sessions * blocks_for(prompt_tokens + max_tokens) * BLOCK_SIZE
    params = SamplingParams(max_new_tokens=max_tokens)  # no stop token: the bench ends it
    results = {}
    for name, kind in (("worst case reserved (former rule)", WorstCaseEngine),
                       ("paged: blocks needed now", VerifyEngine)):
        engine = kind(runner, kv_tokens=budget)
        results[name] = asyncio.run(_serve(engine, prompts, params, answer, wait_s))
    return results


class AdmissionSettings(BaseModel):
    """How many sessions one KV budget admits: worst cases reserved (the former rule) against
    paged blocks, side by side on the same engine code."""

    target: DirectoryPath | None = Field(None, description="Target model folder (default: "
                                         "SmolLM2-135M-Instruct).")
    sessions: int = Field(64, ge=1, description="Sessions arriving at once.")
    budget_sessions: int = Field(8, ge=1, description="The KV budget, in worst cases (prompt "
                                 "plus max_tokens, in whole blocks).")
    prompt_tokens: int = Field(100, ge=1, description="Tokens per prompt (no two share a "
                               "prefix).")
    max_tokens: int = Field(1024, ge=1, description="Tokens each session asks for.")
    answer_tokens: int = Field(100, ge=1, description="Tokens after which each session ends "
                               "(its answer met a stop sequence).")
    wait_s: float = Field(600.0, ge=0, description="How long a session waits for KV memory "
                          "before it is refused.")


def run(settings: AdmissionSettings) -> None:
    """Serve the sessions under both rules and print the table and the ratios."""
    from cascade.tools.pairs import default_target

    s = settings
    target = default_target(s.target)
    runner = ModelRunner.load(ModelSpec(str(target)))
    results = measure(runner, s.sessions, s.budget_sessions, s.prompt_tokens, s.max_tokens,
                      s.answer_tokens, s.wait_s)
    print(f"{machine()}, {torch.get_num_threads()} torch threads; {s.sessions} sessions, "
          f"{s.prompt_tokens}-token prompts, max_tokens {s.max_tokens}, answers of "
          f"{s.answer_tokens}; budget: {s.budget_sessions} worst cases")
    print(_table(results))


def _table(results: dict[str, dict]) -> str:
    lines = ["| admission | most open at once | mean open | refused | preemptions | wall (s) "
             "| tokens/s |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['peak']} | {r['mean']:.1f} | {r['refused']} | "
                     f"{r['preemptions']} | {r['seconds']:.1f} | {r['tokens_per_s']:.0f} |")
    first, second = results.values()
    lines.append(f"| ratio | {second['peak'] / first['peak']:.2f}x | "
                 f"{second['mean'] / first['mean']:.2f}x | | | | "
                 f"{second['tokens_per_s'] / first['tokens_per_s']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    settings_command(AdmissionSettings, run)()
