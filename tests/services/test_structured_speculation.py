"""Jump-forward through real drafter and verifier servers (the tiny pair, with its tokenizer):
the verifier fills the positions a JSON schema forces after its own token, and a drafter that
drafts during verification foresees them in its guessed contexts. Greedy output stays the
target's masked greedy decoding whether the guess foresaw the filled tokens (a hit) or not
(a miss on both sides: the verifier drops the block sent ahead, the drafter drafts again)."""

import pytest

from cascade.core.proposers.model import ModelProposer
from cascade.core.plan.speculation import Outcome
from cascade.protocol.grammar import Grammar
from cascade.protocol.settings import SamplingParams
from cascade.serving.mesh.delay import LinkDelay
from cascade.v1 import common_pb2
from drafter_service.predrafts import PreDrafter
from drafter_service.server import build_drafter
from drafter_service.speculation import SpeculationConfig
from grammar_reference import SCHEMAS, masked_greedy
from pod_requests import run_session
from verifier_service.server import build_verifier

MAX_NEW = 40


@pytest.fixture
def pair(tiny_runners):
    return tiny_runners


@pytest.fixture
async def servers(pair):
    target, drafter = pair
    verifier, _ = build_verifier(target, grace_s=1.0)
    speculation = SpeculationConfig("ahead", send_ahead=2)
    draft_service, _ = build_drafter(drafter, grace_s=1.0, delay=LinkDelay(15.0, seed=1),
                                     speculation=speculation)
    for service in (verifier, draft_service):
        await service.start()
    yield verifier, draft_service
    for service in (draft_service, verifier):
        await service.drain()


def oracle(expected: list[int]):
    """Guesses that know the target's output: the real outcome of every block."""

    async def guesses(self, method, base, drafted, parents=None):
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == expected[len(base) + accepted]:
            accepted += 1
        return [Outcome(accepted, expected[len(base) + accepted])]

    return guesses


@pytest.mark.parametrize("foresee", [True, False], ids=["foreseen", "not-foreseen"])
async def test_filled_verdicts_and_guesses_stay_exact(servers, pair, monkeypatch, foresee):
    verifier, draft_service = servers
    target, _ = pair
    tokenizer = target.tokenizer
    prompt = tokenizer("def main():").input_ids
    grammar = Grammar.json_schema(SCHEMAS["flat"])
    reference = masked_greedy(target, prompt, grammar, MAX_NEW)
    monkeypatch.setattr(PreDrafter, "_guesses", oracle(prompt + reference))
    if not foresee:
        monkeypatch.setattr(ModelProposer, "filled_after", lambda self, context: [])
    params = SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=(tokenizer.eos_token_id,),
                            grammar=grammar)
    rounds = await run_session(draft_service.address, verifier.address, prompt, params, 4)
    assert [t for r in rounds for t in r.tokens] == reference
    filled = [i for i, r in enumerate(rounds[:-1]) if r.stats.num_filled]
    assert filled and sum(r.stats.num_forced for r in rounds) >= sum(r.stats.num_filled for r in rounds)
    after_filled = [rounds[i + 1].stats.speculation for i in filled]
    if foresee:  # a busy machine may let a verdict land before its guess was pre-drafted
        assert set(after_filled) & {common_pb2.SPECULATION_AHEAD_HIT,
                                    common_pb2.SPECULATION_CACHE_HIT}, after_filled
    else:
        assert set(after_filled) == {common_pb2.SPECULATION_MISS}, after_filled
