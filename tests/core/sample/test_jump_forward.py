"""Jump-forward under a grammar: positions where it allows exactly one token are filled, by the
verifier after its own token (no pass) and by the model drafter inside its chains (no forward
of its model, not counted against k), and counted in the stats.

Greedy output equals the slow masked reference (``grammar_reference``) for the target alone
and k = 4 chains; a sampled generation is the same token for token with and without the
verifier's filling (a forced position's token does not depend on its random number); the
drafter foresees what the verifier fills after a guessed outcome."""

import pytest

import cascade.core.verify.verification as verification
from cascade.core.sample.grammar import GrammarMatcher
from cascade.core.loop import generate, speculative_rounds
from cascade.core.sample.processors import fill
from cascade.core.proposers import ProposerContext
from cascade.core.proposers.model import ModelProposer
from cascade.protocol.grammar import Grammar
from cascade.protocol.settings import DraftConfig, SamplingParams
from grammar_reference import SCHEMAS, masked_greedy

PROMPT = "def main():"
MAX_NEW = 48


@pytest.fixture
def pair(tiny_runners):
    return tiny_runners


def _params(target, name: str, **fields) -> SamplingParams:
    return SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=(target.tokenizer.eos_token_id,),
                          grammar=Grammar.json_schema(SCHEMAS[name]), **fields)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_target_alone_fills_forced_positions_without_a_pass(pair, name):
    """Each pass emits one token of the target's and fills what the grammar forces after it:
    passes = tokens - filled, and the output is the masked reference's."""
    target, _ = pair
    prompt = target.tokenizer(PROMPT).input_ids
    result = generate(target, prompt, _params(target, name))
    assert result.tokens == masked_greedy(target, prompt, _params(target, name).grammar, MAX_NEW)
    stats = result.stats
    assert stats.num_filled_tokens > 0 and stats.num_forced_tokens >= stats.num_filled_tokens
    assert stats.num_target_passes == len(result.tokens) - stats.num_filled_tokens


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_chains_fill_forced_positions_without_the_drafters_model(pair, monkeypatch, name):
    """k = 4: the model drafter runs its model at most k times per block; forced positions
    come on top (some blocks are longer than k), and the output is the masked reference's."""
    target, drafter = pair
    prompt = target.tokenizer(PROMPT).input_ids
    forwards = []
    model_row = ModelProposer._logits_after

    def counted(self, *args):
        forwards[-1] += 1
        return model_row(self, *args)

    monkeypatch.setattr(ModelProposer, "_logits_after", counted)
    propose = ModelProposer.propose

    def block(self, committed, num_tokens, stop=None):
        forwards.append(0)
        return propose(self, committed, num_tokens, stop)

    monkeypatch.setattr(ModelProposer, "propose", block)
    params = _params(target, name)
    rounds = list(speculative_rounds(target, prompt, params, drafter, DraftConfig(4)))
    verifier = rounds[-1][2]
    assert verifier.generated == masked_greedy(target, prompt, params.grammar, MAX_NEW)
    drafts = [draft for draft, _, _ in rounds]
    assert max(forwards) <= 4 and max(d.num_tokens for d in drafts) > 4
    assert sum(forwards) < sum(d.num_tokens for d in drafts)
    assert verifier.stats.num_forced_tokens > 0


@pytest.mark.parametrize("k", [0, 3])
def test_sampled_output_is_the_same_with_and_without_filling(pair, monkeypatch, k):
    """Target alone: the same tokens, seed for seed (each position's random number is keyed by
    its position, and a forced position's token does not depend on it), in fewer passes."""
    target, drafter = pair
    prompt = target.tokenizer(PROMPT).input_ids
    for seed in range(3):
        params = _params(target, "nested", temperature=1.0, seed=seed)
        filled = generate(target, prompt, params, drafter, DraftConfig(k))
        with monkeypatch.context() as patch:
            patch.setattr(verification, "fill", lambda *args: [])
            unfilled = generate(target, prompt, params, drafter, DraftConfig(k))
        assert filled.stats.num_filled_tokens > 0 == unfilled.stats.num_filled_tokens
        if k == 0:  # with drafts, which token a position gets depends on its role in its block
            assert filled.tokens == unfilled.tokens
            assert filled.stats.num_target_passes < unfilled.stats.num_target_passes
        else:  # the drafter fills the same positions inside its blocks when the verifier does not
            assert filled.stats.num_target_passes <= unfilled.stats.num_target_passes


def test_no_filling_when_logprobs_are_asked(pair):
    """A filled token has no row of the pass, so no logprob: the verifier does not fill."""
    target, _ = pair
    prompt = target.tokenizer(PROMPT).input_ids
    result = generate(target, prompt, _params(target, "flat", logprobs=2))
    assert result.stats.num_filled_tokens == 0 < result.stats.num_forced_tokens
    assert result.tokens == generate(target, prompt, _params(target, "flat")).tokens


def test_the_drafter_foresees_the_verifiers_filling(pair):
    """After every prefix of the output, the tokens the drafter says the verifier fills are
    the ones the verifier's grammar state fills."""
    target, drafter = pair
    prompt = target.tokenizer(PROMPT).input_ids
    params = _params(target, "flat")
    output = masked_greedy(target, prompt, params.grammar, MAX_NEW)
    proposer = ModelProposer(ProposerContext(drafter, params, DraftConfig(4),
                                             prompt_len=len(prompt)))
    foreseen = 0
    for n in range(len(output) - 1):
        generated = output[:n]
        matcher = GrammarMatcher(params.grammar, target.tokenizer, target.vocab_size, generated)
        expected = fill(matcher, params, generated, MAX_NEW - n)
        assert proposer.filled_after(prompt + generated) == expected
        foreseen += len(expected)
    assert foreseen > 0
