"""Admission by KV memory, with a fair share per API key: while another key's session waits,
a key that holds its share of the budget admits nothing more, so freed memory goes to the
waiting key; with no one else waiting a key may take everything."""

import asyncio

import pytest

from cascade.protocol.settings import SamplingParams
from cascade.protocol.wire.convert import sampling_to_pb
from cascade.serving.errors import Overloaded
from cascade.v1 import verifier_pb2
from models import random_prompts
from plans import CHEAP
from verifier_service.scheduler import VerifierSettings
from verifier_service.server import build_verifier

PROMPT = random_prompts(1, seed=50, min_len=10, max_len=10)[0]


def opening(name: str, scope: str) -> verifier_pb2.SessionOpen:
    """A session needing one block now (its context and a step)."""
    return verifier_pb2.SessionOpen(
        session_id=name, epoch=1, context_tokens=PROMPT, prompt_len=len(PROMPT),
        sampling=sampling_to_pb(SamplingParams(max_new_tokens=40)), prefix_scope=scope)


async def test_a_key_that_took_its_share_waits_while_another_key_waits(gpt2_pair):
    target, _ = gpt2_pair
    _, sessions = build_verifier(target, grace_s=1.0, step_cost=CHEAP, settings=VerifierSettings(
        kv_tokens=8 * 64, admission_wait_s=5.0, max_kv_share=0.5))
    greedy = [await sessions.open(opening(f"a{i}", "key:a")) for i in range(4)]  # all of it
    # a block each now and one of growth: no one else waited, so a key may take all
    assert sessions.admission.held("key:a") == 8 * 64 and sessions.engine.promised() == 8
    more = asyncio.ensure_future(sessions.open(opening("a4", "key:a")))
    await asyncio.sleep(0.05)  # key a waits first
    other = asyncio.ensure_future(sessions.open(opening("b0", "key:b")))
    await asyncio.sleep(0.05)
    assert not other.done() and not more.done()  # memory is full: both wait
    await sessions.close(greedy[0])
    b0 = await asyncio.wait_for(other, 2.0)  # the freed memory goes to the other key
    assert b0.sequence.cache.scope == "key:b" and not more.done()
    await sessions.close(greedy[1])
    a4 = await asyncio.wait_for(more, 5.0)  # no one else waits: key a takes it
    for session in (b0, a4, *greedy[2:]):
        await sessions.close(session)
    assert sessions.engine.store.reserved == 0


async def test_an_open_that_never_gets_memory_is_refused_in_time(gpt2_pair):
    target, _ = gpt2_pair
    _, sessions = build_verifier(target, grace_s=1.0, step_cost=CHEAP, settings=VerifierSettings(
        kv_tokens=64, admission_wait_s=0.2))
    held = await sessions.open(opening("a0", "key:a"))
    with pytest.raises(Overloaded, match="retry later"):
        await sessions.open(opening("b0", "key:b"))
    await sessions.close(held)
    assert sessions.admission.waiting == {}
