"""How many sessions one KV budget admits: the former rule (each session reserved its prompt
plus max_tokens when it opened) against paged blocks (admission counts the blocks a session
needs now; running sessions grow and, when blocks run out, the latest admitted are preempted),
side by side in one run on the same engine code.

    python -m cascade.bench.admission [--target DIR] [--sessions 64] [--budget-sessions 8]
        [--prompt-tokens 100] [--max-tokens 1024] [--answer-tokens 100]

Every session arrives at once, asks for ``max_tokens`` and ends after ``answer_tokens`` (its
answer met a stop sequence); each is decoded by the target alone through the verifier's
scheduler and admission (waiting up to ``--wait-s`` for memory, as a verifier does). The budget
is ``budget_sessions`` worst cases (prompt plus max_tokens, in whole blocks). Prints, per rule,
the most sessions open at once, the mean, sessions refused, preemptions, and the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from cascade.bench.run import machine
from cascade.core.blocks import Draft
from cascade.core.verify.engine import KVBudgetExhausted, VerifyEngine
from cascade.core.kv.kv_store import BLOCK_SIZE, blocks_for
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from cascade.serving.errors import Overloaded
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


def main() -> None:
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--budget-sessions", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--answer-tokens", type=int, default=100)
    parser.add_argument("--wait-s", type=float, default=600.0)
    args = parser.parse_args()
    target = args.target or default_pair(None, None, "smollm2")[0]
    runner = ModelRunner.load(ModelSpec(str(target)))
    results = measure(runner, args.sessions, args.budget_sessions, args.prompt_tokens,
                      args.max_tokens, args.answer_tokens, args.wait_s)
    print(f"{machine()}, {torch.get_num_threads()} torch threads; {args.sessions} sessions, "
          f"{args.prompt_tokens}-token prompts, max_tokens {args.max_tokens}, answers of "
          f"{args.answer_tokens}; budget: {args.budget_sessions} worst cases")
    print("| admission | most open at once | mean open | refused | preemptions | wall (s) "
          "| tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['peak']} | {r['mean']:.1f} | {r['refused']} | "
              f"{r['preemptions']} | {r['seconds']:.1f} | {r['tokens_per_s']:.0f} |")
    first, second = results.values()
    print(f"| ratio | {second['peak'] / first['peak']:.2f}x | "
          f"{second['mean'] / first['mean']:.2f}x | | | | "
          f"{second['tokens_per_s'] / first['tokens_per_s']:.2f}x |")


if __name__ == "__main__":
    main()
