"""Preemption through the verifier's scheduler: a row whose sequence was preempted to make room
is queued again, and every session still ends with exactly its own greedy output."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from cascade.core.blocks import Draft
from cascade.core.verify.engine import VerifyEngine
from cascade.core.kv.kv_store import BLOCK_SIZE
from cascade.core.verify.verification import SequenceVerifier
from cascade.protocol.settings import SamplingParams
from models import random_prompts, tiny_llama
from verifier_service.scheduler import StepScheduler, VerifierSettings

PARAMS = SamplingParams(max_new_tokens=150)  # up to 4 blocks each


def _alone(target, prompt) -> list[int]:
    engine = VerifyEngine(target, kv_tokens=8 * BLOCK_SIZE)
    sequence = SequenceVerifier(target, prompt, PARAMS, engine=engine)
    while not sequence.is_finished:
        sequence.verify(Draft([]))
    return sequence.generated


async def test_preempted_items_run_again_and_every_session_is_exact():
    target = tiny_llama(0)
    engine = VerifyEngine(target, kv_tokens=12 * BLOCK_SIZE)  # 6 sessions would need 24
    scheduler = StepScheduler(engine, ThreadPoolExecutor(1), VerifierSettings())
    prompts = random_prompts(6, seed=21, min_len=10, max_len=50)
    sequences = [SequenceVerifier(target, p, PARAMS, engine=engine) for p in prompts]

    async def run(sequence):
        while not sequence.is_finished:
            await scheduler.submit(sequence, Draft([]))
        sequence.close()

    await asyncio.wait_for(asyncio.gather(*(run(s) for s in sequences)), 120)
    assert engine.preemptions > 0 and engine.store.held == 0
    for sequence, prompt in zip(sequences, prompts, strict=True):
        assert sequence.generated == _alone(target, prompt)
