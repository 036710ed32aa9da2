"""The recursive rule (SpecInfer's multi-step speculative sampling over a tree node's sampled
children): each step emits exactly the target's distribution (N = 200,000 on adversarial pairs,
one to four children), a two-level tree walk emits the target's joint distribution, and the
drafter builds trees whose every node carries the q it was sampled from."""

import pytest
import torch

from cascade.core.loop import generate
from cascade.core.proposers.tree import TreeShape, draft_sampled_tree
from cascade.core.accept.tree_accept import recursive_siblings, walk_recursive
from cascade.protocol.trees import tree_problem
from cascade.protocol.settings import DraftConfig, SamplingParams
from cascade.protocol.acceptance import AcceptancePolicy, AcceptanceRule
from models import random_prompts, tiny_llama
from distributions import ADVERSARIAL, N, VOCAB, assert_matches, random_distribution

RECURSIVE = AcceptancePolicy(AcceptanceRule.RECURSIVE)


def _samples(q: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(q.float(), N * count, replacement=True,
                             generator=generator).view(N, count)


@pytest.mark.parametrize("pair", ADVERSARIAL)
@pytest.mark.parametrize("count", [1, 4])
def test_one_step_over_sampled_siblings_emits_p(pair, count):
    p, q = ADVERSARIAL[pair]
    children = _samples(q, count, seed=count)
    generator = torch.Generator().manual_seed(7)
    u_accept = torch.rand(N, count, generator=generator, dtype=torch.float64)
    u_sample = torch.rand(N, generator=generator, dtype=torch.float64)
    index, token = recursive_siblings(p.expand(N, VOCAB), q.expand(N, count, VOCAB), children,
                                      torch.full((N,), count), u_accept, u_sample)
    assert_matches(token, p)
    kept = index >= 0
    assert torch.equal(token[kept], children[kept].gather(1, index[kept, None]).squeeze(1))


def _without_replacement(q: torch.Tensor, count: int, seed: int):
    """N rows of ``count`` children drawn from q without replacement (Gumbel-top-k), with the
    q each was drawn from (q without the earlier ones, renormalised) and how many exist."""
    generator = torch.Generator().manual_seed(seed)
    uniform = torch.rand(N, VOCAB, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    support = int((q > 0).sum())
    children = (q.log() - (-uniform.log()).log()).topk(count, dim=-1).indices  # [N, count]
    left, proposals = q.expand(N, VOCAB).clone(), []
    for j in range(count):
        proposals.append(left / left.sum(-1, keepdim=True).clamp_min(1e-300))
        left = left.scatter(1, children[:, j:j + 1], 0.0)
    return children, torch.stack(proposals, 1), torch.full((N,), min(count, support))


@pytest.mark.parametrize("pair", ADVERSARIAL)
@pytest.mark.parametrize("count", [2, 4])
def test_siblings_drawn_without_replacement_with_their_own_q_also_emit_p(pair, count):
    p, q = ADVERSARIAL[pair]
    children, proposals, num_children = _without_replacement(q, count, seed=count)
    generator = torch.Generator().manual_seed(8)
    u_accept = torch.rand(N, count, generator=generator, dtype=torch.float64)
    u_sample = torch.rand(N, generator=generator, dtype=torch.float64)
    _, token = recursive_siblings(p.expand(N, VOCAB), proposals, children, num_children,
                                  u_accept, u_sample)
    assert_matches(token, p)


def test_a_two_level_walk_emits_the_targets_joint_distribution():
    """Root: three children sampled from q0; the first gets three children from q1 of it. The
    target's second distribution depends on the first token."""
    p0, q0 = random_distribution(11), random_distribution(12, zeros=2)
    p1 = torch.stack([random_distribution(20 + a) for a in range(VOCAB)])
    q1 = torch.stack([random_distribution(40 + a) for a in range(VOCAB)])
    parents = [-1, -1, -1, 0, 0, 0]
    count, pairs = 20_000, []
    generator = torch.Generator().manual_seed(3)
    for seed in range(count):
        first = torch.multinomial(q0.float(), 3, replacement=True, generator=generator).tolist()
        second = torch.multinomial(q1[first[0]].float(), 3, replacement=True,
                                   generator=generator).tolist()
        tokens = first + second
        p = torch.stack([p0, p1[first[0]], p1[first[1]], p1[first[2]], *[p0] * 3])
        q = torch.stack([q0] * 3 + [q1[first[0]]] * 3)
        verdict = walk_recursive(parents, tokens, p, q, seed, base=10)
        emitted = [tokens[n] for n in verdict.path] + [verdict.next_token]
        if len(emitted) < 2:  # the second token comes from the next round: decode it alone
            emitted.append(int(torch.multinomial(p1[emitted[0]].float(), 1,
                                                 generator=generator)))
        pairs.append(emitted[0] * VOCAB + emitted[1])
    joint = (p0[:, None] * p1).flatten()
    observed = torch.bincount(torch.tensor(pairs), minlength=VOCAB * VOCAB).double() / count
    assert (observed[joint == 0] == 0).all()
    expected_tv = 0.5 * torch.sqrt(2 * joint * (1 - joint) / (torch.pi * count)).sum()
    assert 0.5 * (observed - joint).abs().sum() < 2 * expected_tv  # seeded: deterministic


def test_the_drafter_samples_whole_sibling_sets_and_sends_their_q():
    drafter = tiny_llama(6)
    cache = drafter.new_cache()
    prefix = [3, 17, 5, 40, 2, 9]
    torch.manual_seed(0)

    def sample(logits, position, count):
        probs = torch.softmax(logits, -1)
        ids = torch.multinomial(probs, count, replacement=True)
        proposals = probs[:, None].expand(-1, count, -1)
        return ids, torch.arange(probs.shape[-1]).expand_as(probs), proposals

    tokens, parents, q_ids, q_probs = draft_sampled_tree(cache, prefix,
                                                         TreeShape(13, 3, 3), sample)
    assert tree_problem(parents, 13, 3) is None and len(tokens) <= 13
    assert parents[:3] == [-1, -1, -1]
    for parent in set(parents):  # every expanded node has exactly `branching` children
        assert parents.count(parent) == 3
    assert q_ids.shape[0] == q_probs.shape[0] == len(tokens)
    assert cache.tokens == prefix  # the fed nodes wait aside, one path each
    assert len(cache.grown) == cache.cache.get_seq_length() - len(prefix)


def test_sampled_generation_with_recursive_trees_runs_and_accepts(llama_pair):
    target, _ = llama_pair
    prompt = random_prompts(1, seed=14)[0]
    params = SamplingParams(temperature=0.8, seed=5, max_new_tokens=20)
    config = DraftConfig(num_draft_tokens=3, tree_nodes=12, tree_branching=3)
    result = generate(target, prompt, params, target, config, policy=RECURSIVE)
    assert len(result.tokens) == 20
    assert result.stats.num_accepted_tokens > 0  # the target drafting for itself


def test_children_are_sampled_from_the_q_they_carry(monkeypatch):
    """Each child is the inverse-CDF draw from the float32 q it is sent with (not from the
    float64 values before rounding): uniforms set at every boundary of the first child's sent
    q, where a draw from other values would pick the neighbouring token."""
    from types import SimpleNamespace

    from cascade.core.proposers import model
    from cascade.core.sample.sampling import sample_from

    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    proposer = SimpleNamespace(sampling=SamplingParams(temperature=1.0, seed=5),
                               config=SimpleNamespace(max_proposal_tokens=32))
    _, _, first = model.ModelProposer._sample_children(proposer, logits, 0, 1)
    for row in range(2):
        cdf = first[row, 0].double().cumsum(0)
        for boundary in (cdf[:-1] / cdf[-1]).tolist():
            monkeypatch.setattr(model, "position_uniform", lambda *_: boundary)
            children, ids, sent = model.ModelProposer._sample_children(proposer, logits, 0, 3)
            u = torch.tensor([boundary], dtype=torch.float64)
            for j in range(3):
                column = sample_from(sent[row, j][None], u)[0]
                assert children[row, j] == ids[row, column]
