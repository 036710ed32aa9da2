"""Guessing outcomes and pre-drafting for them (speculative speculative decoding), core level:
the ranking, and that a pre-drafted block samples exactly from the q it carries, so the sampling
distribution stays the target's on the hit path (a pre-draft) and the miss path (a fresh draft).
"""

import pytest
import torch

from cascade.core.accept.acceptance import speculative_accept
from cascade.core.proposers import ProposerContext, new_proposer
from cascade.core.proposers.base import DraftStopped
from cascade.core.sample.sampling import (
    STREAM_DRAFT,
    position_uniform,
    process_logits,
    sample_from,
    sparse_to_dense,
)
from cascade.core.plan.speculation import Guess, Outcome, ends_generation, rank_outcomes
from cascade.core.trees import path_to
from cascade.protocol.settings import DraftConfig, SamplingParams
from models import VOCAB_SIZE, random_prompts
from distributions import N, assert_matches


def test_outcomes_are_ranked_by_the_drafters_chance_of_them():
    probs = torch.tensor([[0.6, 0.3, 0.1, 0.0],  # position 0: drafted 0
                          [0.2, 0.1, 0.7, 0.0],  # position 1: drafted 2
                          [0.5, 0.25, 0.15, 0.1]])  # the bonus position
    guesses = rank_outcomes(probs, [0, 2], fanout=2, max_guesses=10)
    scores = {g.outcome: g.score for g in guesses}
    assert scores == pytest.approx({
        Outcome(0, 1): 0.3, Outcome(0, 2): 0.1,  # the drafted token 0 is no guess at 0
        Outcome(1, 0): 0.6 * 0.2, Outcome(1, 1): 0.6 * 0.1,
        Outcome(2, 0): 0.6 * 0.7 * 0.5, Outcome(2, 1): 0.6 * 0.7 * 0.25})
    assert [g.score for g in guesses] == sorted(scores.values(), reverse=True)
    assert rank_outcomes(probs, [0, 2], fanout=2, max_guesses=3) == guesses[:3]
    assert rank_outcomes(probs, [0, 2], fanout=0, max_guesses=3) == []


def test_an_outcome_gives_the_context_it_assumes_and_whether_it_ends():
    outcome = Outcome(1, 9)
    assert outcome.context([1, 2], [5, 6, 7]) == [1, 2, 5, 9]
    params = SamplingParams(max_new_tokens=3, stop_token_ids=(6,))
    assert not ends_generation(outcome, [5, 6], 4, 2, params)
    assert ends_generation(Outcome(2, 8), [5, 6], 5, 2, params)  # the stop token 6 is accepted
    assert ends_generation(Outcome(0, 6), [5], 3, 2, params)  # the stop token is chosen
    assert ends_generation(outcome, [5], 5, 2, params)  # max_new_tokens reached
    assert Guess(0.5, outcome).outcome == outcome


PARAMS = SamplingParams(temperature=1.0, top_k=6, seed=0, max_new_tokens=16)


def proposer(drafter, seed: int = 0):
    params = SamplingParams(temperature=1.0, top_k=6, seed=seed, max_new_tokens=16)
    return new_proposer(ProposerContext(drafter, params, DraftConfig(1), None, 4))


def pre_drafted(drafter, context, seed: int = 0):
    """The block a speculating drafter pre-drafts after ``context``: its cache first drafted
    and ranked another block, then it drafts after ``context`` (ending in a guessed token) in
    one batch with another guess."""
    p = proposer(drafter, seed)
    elsewhere = context[:-1] + [(context[-1] + 1) % VOCAB_SIZE]
    drafted = p.propose(elsewhere, 1).tokens
    p.block_distributions(elsewhere, drafted)
    return p.propose_many([context, elsewhere + [3, 4]], [1, 1])[0]


@pytest.mark.parametrize("path", ["hit", "miss"])
def test_sampling_from_a_pre_drafted_block_is_the_targets(gpt2_pair, path):
    target, drafter = gpt2_pair
    context = random_prompts(1, seed=71, min_len=6)[0]
    draft = (pre_drafted(drafter, context) if path == "hit"
             else proposer(drafter).propose(context, 1))
    fresh = proposer(drafter).propose(context, 1)
    torch.testing.assert_close(draft.q_probs, fresh.q_probs, rtol=1e-5, atol=1e-6)
    for seed in range(40):  # the path samples from the very q it sends, for every seed
        block = pre_drafted(drafter, context, seed) if path == "hit" else proposer(
            drafter, seed).propose(context, 1)
        u = torch.tensor([position_uniform(seed, len(context), STREAM_DRAFT)],
                         dtype=torch.float64)
        assert block.tokens[0] == int(draft.q_ids[0, sample_from(draft.q_probs, u)[0]])
    q = sparse_to_dense(draft.q_ids, draft.q_probs, VOCAB_SIZE)[0].double()  # [V]
    logits = target.new_cache().forward_to(context).logits[-1]
    p = process_logits(logits[None], PARAMS)[0].double()  # [V]
    assert_matches(first_tokens(p, q, seed=5), p)


def first_tokens(p: torch.Tensor, q: torch.Tensor, seed: int) -> torch.Tensor:
    """N rounds of one drafted token: drafts drawn from q by the drafter's sampler, verified by
    speculative sampling against p; the first emitted token of each."""
    generator = torch.Generator().manual_seed(seed)
    uniforms = torch.rand(N, 4, generator=generator, dtype=torch.float64)
    drafts = sample_from(q.float().expand(N, -1), uniforms[:, 0])
    target = torch.stack([p, p]).expand(N, 2, -1)
    result = speculative_accept(drafts[:, None], torch.ones(N, dtype=torch.long), target,
                                q.expand(N, 1, -1), uniforms[:, 1:2], uniforms[:, 2:])
    return torch.where(result.num_accepted == 1, drafts, result.next_token)


def test_a_pre_draft_stops_between_tokens_when_asked(gpt2_pair):
    _, drafter = gpt2_pair
    p = new_proposer(ProposerContext(drafter, SamplingParams(max_new_tokens=16),
                                     DraftConfig(4), None, 4))
    context = random_prompts(1, seed=72)[0]
    with pytest.raises(DraftStopped):
        p.propose(context, 4, stop=lambda: True)
    assert len(p.propose(context, 4, stop=lambda: False).tokens) == 4


@pytest.mark.parametrize("pair", ["gpt2_pair", "llama_pair"])
def test_batched_pre_drafts_equal_drafting_each_guess_alone(request, pair):
    _, drafter = request.getfixturevalue(pair)
    base = random_prompts(1, seed=73, min_len=8)[0]
    contexts = [base + [5], base + [6, 7], base + [8, 9, 10, 11], base[:-1] + [12]]
    budgets = [4, 3, 4, 2]
    for params in (SamplingParams(max_new_tokens=32),
                   SamplingParams(temperature=0.8, seed=9, max_new_tokens=32)):
        alone = new_proposer(ProposerContext(drafter, params, DraftConfig(4), None, 4))
        batched = new_proposer(ProposerContext(drafter, params, DraftConfig(4), None, 4))
        many = batched.propose_many(contexts, budgets)
        for context, budget, draft in zip(contexts, budgets, many):
            single = alone.propose(context, budget)
            assert draft.tokens == single.tokens and len(draft.tokens) == budget
            if params.temperature:
                torch.testing.assert_close(draft.q_probs, single.q_probs, rtol=1e-4, atol=1e-5)
        stopped = batched.propose_many(contexts, budgets, stop=lambda: True)
        assert [d.tokens for d in stopped] == [d.tokens[:1] for d in many]  # what each had


def test_drafting_guesses_one_at_a_time_stops_between_them(llama_pair):
    """A proposer that cannot batch (the base class's propose_many) returns the drafts it
    finished when stopped."""
    from cascade.core.proposers.base import Proposer

    _, drafter = llama_pair
    p = new_proposer(ProposerContext(drafter, SamplingParams(max_new_tokens=32),
                                     DraftConfig(3), None, 4))
    contexts = [random_prompts(1, seed=74)[0] + [t] for t in (1, 2, 3)]
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 2  # the first draft's two checks pass, the second's first stops

    drafts = Proposer.propose_many(p, contexts, [3, 3, 3], stop)
    assert len(drafts) == 1 and drafts[0].tokens == p.propose(contexts[0], 3).tokens


def test_tree_outcomes_are_ranked_along_paths_without_the_childrens_tokens():
    # root children: node 0 (token 0) and node 1 (token 1); node 2 (token 2) is node 0's child
    parents, tokens = [-1, -1, 0], [0, 1, 2]
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05],  # after the committed tokens
                          [0.1, 0.2, 0.6, 0.1],  # after node 0
                          [0.45, 0.35, 0.1, 0.1],  # after node 1 (a leaf)
                          [0.7, 0.1, 0.1, 0.1]])  # after node 2 (a leaf)
    guesses = rank_outcomes(probs, tokens, fanout=1, max_guesses=10, parents=parents)
    scores = {g.outcome: g.score for g in guesses}
    assert scores == pytest.approx({
        Outcome(0, 2): 0.15,  # tokens 0 and 1 are root children: accepted, not guessed
        Outcome(1, 1, (0,)): 0.5 * 0.2,  # token 2 is node 0's child
        Outcome(1, 0, (1,)): 0.3 * 0.45,  # after a leaf: any token
        Outcome(2, 0, (0, 2)): 0.5 * 0.6 * 0.7})
    assert [g.outcome for g in guesses] == [Outcome(2, 0, (0, 2)), Outcome(0, 2),
                                            Outcome(1, 0, (1,)), Outcome(1, 1, (0,))]
    chain = rank_outcomes(probs[[0, 1, 3]], [0, 2], fanout=2, max_guesses=10)
    as_tree = rank_outcomes(probs[[0, 1, 3]], [0, 2], 2, 10, parents=[-1, 0])
    assert [(g.score, g.outcome.num_accepted, g.outcome.next_token) for g in chain] == [
        (g.score, g.outcome.num_accepted, g.outcome.next_token) for g in as_tree]
    assert all(not g.outcome.path for g in chain)  # a chain's outcomes name no path


def test_a_tree_outcome_gives_the_context_along_its_path():
    outcome = Outcome(2, 9, (0, 2))
    assert outcome.context([1, 2], [5, 6, 7]) == [1, 2, 5, 7, 9]
    assert outcome.accepted([5, 6, 7]) == [5, 7]
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(6,))
    assert not ends_generation(outcome, [5, 6, 7], 5, 2, params)  # node 1 (token 6) is off it
    assert ends_generation(Outcome(1, 3, (1,)), [5, 6, 7], 4, 2, params)


def tree_proposer(drafter, expansion="dynamic"):
    config = DraftConfig(3, tree_nodes=8, tree_branching=2, tree_expansion=expansion)
    return new_proposer(ProposerContext(drafter, SamplingParams(max_new_tokens=32), config,
                                        None, 4))


@pytest.mark.parametrize("expansion", ["dynamic", "confidence"])
def test_a_trees_distributions_equal_feeding_each_path_alone(llama_pair, expansion):
    """One pass over every node (leaves included) against the slow reference: the path to each
    node fed as a chain; the cache holds the committed tokens again after it, every node
    aside by its path."""
    _, drafter = llama_pair
    committed = random_prompts(1, seed=75, min_len=6)[0]
    p = tree_proposer(drafter, expansion)
    tree = p.propose(committed, 8)
    probs = p.block_distributions(committed, tree.tokens, tree.parents)  # [n + 1, vocab]
    assert p.cache.tokens == committed and len(p.cache.grown) == len(tree.tokens)
    assert p.cache.cache.get_seq_length() == len(committed) + len(tree.tokens)
    reference = drafter.new_cache()
    for row in range(len(tree.tokens) + 1):
        path = [tree.tokens[n] for n in path_to(tree.parents, row - 1)]
        expected = torch.softmax(reference.forward_to(committed + path).logits[-1], -1)
        torch.testing.assert_close(probs[row], expected, rtol=1e-4, atol=1e-6)


def test_tree_pre_drafts_come_one_by_one_and_stop_between_depths(llama_pair):
    _, drafter = llama_pair
    base = random_prompts(1, seed=76, min_len=6)[0]
    contexts = [base + [5], base + [6, 7]]
    p = tree_proposer(drafter)
    many = p.propose_many(contexts, [8, 8])
    assert [(d.tokens, d.parents) for d in many] == [
        (t.tokens, t.parents) for t in (tree_proposer(drafter).propose(c, 8) for c in contexts)]
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 3  # the first tree's three depths pass, the second's first stops

    stopped = p.propose_many(contexts, [8, 8], stop)
    assert [d.tokens for d in stopped] == [many[0].tokens]
    with pytest.raises(DraftStopped):
        p.propose(contexts[0], 8, stop=lambda: True)
