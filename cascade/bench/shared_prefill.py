"""n choices of one prompt on the verifier, with the prompt computed once (shared prefixes) and
with every choice computing it, side by side.

    python -m cascade.bench.shared_prefill [--target DIR] [--prompt-tokens 512] [--n 4]
        [--max-tokens 16] [--repeats 3]

Each choice is a session of its own decoded by the target alone through the verifier's
scheduler (the rows of one engine step are batched, as on the pod). Prints, per mode, the time
until every choice has its first token and until every choice is done (medians of the repeats,
modes alternated), and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from cascade.bench.run import machine
from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.model.runner import ModelRunner, ModelSpec
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from verifier_service.scheduler import StepScheduler, VerifierSettings


async def _choices(engine: VerifyEngine, prompt: list[int], n: int, max_tokens: int
                   ) -> tuple[float, float]:
    """Seconds until every choice has its first token, and until all are done."""
    scheduler = StepScheduler(engine, ThreadPoolExecutor(1), VerifierSettings())
    params = SamplingParams(max_new_tokens=max_tokens)
    sequences = [SequenceVerifier(engine.runner, prompt, params, engine=engine) for _ in range(n)]
    started, firsts = time.perf_counter(), []

    async def run(sequence):
        await scheduler.submit(sequence, Draft([]))
        firsts.append(time.perf_counter() - started)
        while not sequence.is_finished:
            await scheduler.submit(sequence, Draft([]))

    await asyncio.gather(*(run(s) for s in sequences))
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


def main() -> None:
    from cascade.tools.pairs import default_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    target = args.target or default_pair(None, None, "smollm2")[0]
    runner = ModelRunner.load(ModelSpec(str(target)))
    runs = measure(runner, args.prompt_tokens, args.n, args.max_tokens, args.repeats)
    first = {s: statistics.median(r[0] for r in runs[s]) for s in runs}
    done = {s: statistics.median(r[1] for r in runs[s]) for s in runs}
    print(f"{machine()}, {torch.get_num_threads()} torch threads, n = {args.n}, "
          f"{args.prompt_tokens}-token prompt, {args.max_tokens} tokens each, target alone")
    print("| prefill | every first token (s) | every choice done (s) |")
    print("|---|---|---|")
    for share, name in ((False, "every choice computes the prompt"), (True, "computed once")):
        print(f"| {name} | {first[share]:.2f} | {done[share]:.2f} |")
    print(f"| ratio | {first[False] / first[True]:.2f}x | {done[False] / done[True]:.2f}x |")


if __name__ == "__main__":
    main()
