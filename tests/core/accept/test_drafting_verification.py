import pytest
import torch

from cascade.core.blocks import Draft
from cascade.core.proposers import ProposerContext, new_proposer
from cascade.core.verify.verification import InvalidDraft, SequenceVerifier
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import hf_greedy, random_prompts
from distributions import assert_matches


def test_drafter_samples_from_exactly_the_proposal_it_sends(gpt2_pair):
    _, drafter = gpt2_pair
    params = SamplingParams(temperature=1.2, top_p=0.95, seed=4)
    session = new_proposer(ProposerContext(drafter, params, DraftConfig(max_proposal_tokens=8)))
    logits = torch.randn(drafter.vocab_size, generator=torch.Generator().manual_seed(0))
    draws = [session.choice.choose(logits, position) for position in range(20_000)]
    ids, probs = draws[0][1], draws[0][2]
    assert all(torch.equal(d[1], ids) for d in draws[:50])
    dense = torch.zeros(drafter.vocab_size, dtype=torch.float64)
    dense[ids] = probs.double()
    assert_matches(torch.tensor([d[0] for d in draws]), dense)


def test_block_carries_sparse_proposal(gpt2_pair):
    _, drafter = gpt2_pair
    params = SamplingParams(temperature=1.0, seed=1)
    session = new_proposer(ProposerContext(drafter, params, DraftConfig(max_proposal_tokens=5)))
    block = session.propose(random_prompts(1, seed=2)[0], 3)
    assert block.num_tokens == 3 and block.q_ids.shape == (3, 5) == block.q_probs.shape
    for i, token in enumerate(block.tokens):
        assert token in block.q_ids[i].tolist()


def test_min_confidence_shortens_blocks(gpt2_pair):
    _, drafter = gpt2_pair
    config = DraftConfig(num_draft_tokens=6, min_confidence=0.99)
    proposer = new_proposer(ProposerContext(drafter, SamplingParams(), config))
    block = proposer.propose(random_prompts(1, seed=3)[0], config.num_draft_tokens)
    assert block.num_tokens == 1  # a random tiny model is never that sure


@pytest.mark.parametrize(
    "block,message",
    [
        (Draft([1000]), "token ids"),
        (Draft([1], torch.tensor([[2, 3]]), torch.tensor([[0.5, 0.5]])), "positive"),
        (Draft([1], torch.tensor([[1, 3]]), torch.tensor([[-0.5, 1.5]])), "non-negative"),
        (Draft([1, 2], torch.tensor([[1, 3]]), torch.tensor([[0.5, 0.5]])), "both be"),
        (Draft([1] * 60), "at most"),
    ],
)
def test_invalid_blocks_are_refused_without_changing_state(gpt2_pair, block, message):
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=4)[0]
    session = SequenceVerifier(target, prompt, SamplingParams(temperature=1.0, max_new_tokens=50))
    with pytest.raises(InvalidDraft, match=message):
        session.verify(block)
    assert session.committed == prompt


def test_prompt_longer_than_context_is_refused(gpt2_pair):
    target, _ = gpt2_pair
    with pytest.raises(ValueError, match="context"):
        SequenceVerifier(target, [1] * target.max_length, SamplingParams())


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_accepted_drafts_after_a_stop_token_are_not_counted(gpt2_pair, shape):
    """The target's own greedy tokens drafted: all four are accepted, but a stop token at the
    second ends the round there, so two count as accepted (blocks never reach past the length
    limit: the drafts are checked against the room left)."""
    target, _ = gpt2_pair
    prompt = random_prompts(1, seed=5)[0]
    greedy = hf_greedy(target, prompt, 4)
    assert greedy[1] not in greedy[:1]
    params = SamplingParams(temperature=0.0, stop_token_ids=(greedy[1],), max_new_tokens=8)
    verifier = SequenceVerifier(target, prompt, params, tree_room=8)
    parents = [-1, 0, 1, 2, -1] if shape == "tree" else None  # a tree: a second root child
    tokens = greedy + [(greedy[0] + 1) % target.vocab_size] if parents else greedy
    outcome = verifier.verify(Draft(tokens, parents=parents))
    assert outcome.tokens == greedy[:2] and outcome.finish_reason is not None
    assert outcome.num_accepted == 2
    assert outcome.path == ((0, 1) if parents else None)
    assert verifier.stats.num_accepted_tokens == 2
    assert verifier.stats.accepted_per_position[:4] == [1, 1, 0, 0]
