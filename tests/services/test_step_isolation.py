"""One session's fault stays in its row: a session closed while its step runs, or a step
whose bookkeeping fails, does not fail the other sessions of the step."""

import asyncio
import threading
import time

from cascade.core.verify.engine import VerifyEngine
from cascade.core.kv.kv_store import BLOCK_SIZE
from cascade.protocol.settings import SamplingParams
from cascade.protocol.wire.convert import sampling_to_pb
from cascade.v1 import verifier_pb2
from models import hf_greedy, random_prompts
from plans import CHEAP
from verifier_service.server import build_verifier


async def open_session(sessions, name, prompt):
    return await sessions.open(verifier_pb2.SessionOpen(
        session_id=name, epoch=1, context_tokens=prompt, prompt_len=len(prompt),
        sampling=sampling_to_pb(SamplingParams(max_new_tokens=8))))


def first_block(name, prompt):
    return verifier_pb2.DraftBlock(session_id=name, epoch=1, round=0, base_len=len(prompt))


async def test_a_session_closed_while_its_step_runs_fails_no_other(gpt2_pair, monkeypatch):
    target, _ = gpt2_pair
    stepping = threading.Event()
    step = VerifyEngine.step
    monkeypatch.setattr(VerifyEngine, "step", lambda self, items: (
        stepping.set(), time.sleep(0.3), step(self, items))[-1])
    _, sessions = build_verifier(target, grace_s=1.0, step_cost=CHEAP)
    a_prompt, b_prompt = random_prompts(2, seed=48)
    a, b = (await open_session(sessions, "a", a_prompt),
            await open_session(sessions, "b", b_prompt))
    a_verdict = asyncio.ensure_future(sessions.verify(a, first_block("a", a_prompt)))
    b_verdict = asyncio.ensure_future(sessions.verify(b, first_block("b", b_prompt)))
    await asyncio.get_running_loop().run_in_executor(None, stepping.wait)
    a_verdict.cancel()  # its stream went away mid-step
    await sessions.close(a)
    verdict = await b_verdict
    assert list(verdict.tokens) == hf_greedy(target, b_prompt, 1)
    assert a.sequence.is_closed and sessions.engine.store.reserved == len(b.sequence.cache.table) * BLOCK_SIZE
    await sessions.close(b)
    assert sessions.engine.store.reserved == 0


async def test_a_step_whose_planning_fails_fails_its_items_not_the_scheduler(gpt2_pair,
                                                                            monkeypatch):
    target, _ = gpt2_pair
    _, sessions = build_verifier(target, grace_s=1.0, step_cost=CHEAP)
    prompt = random_prompts(1, seed=49)[0]
    session = await open_session(sessions, "a", prompt)
    planned = sessions.scheduler._planned
    monkeypatch.setattr(sessions.scheduler, "_planned", lambda items: 1 / 0)
    try:
        await asyncio.wait_for(sessions.verify(session, first_block("a", prompt)), 10)
        raise AssertionError("the step's fault did not reach its item")
    except ZeroDivisionError:
        pass
    monkeypatch.setattr(sessions.scheduler, "_planned", planned)
    verdict = await asyncio.wait_for(sessions.verify(session, first_block("a", prompt)), 10)
    assert list(verdict.tokens) == hf_greedy(target, prompt, 1)
    await sessions.close(session)
